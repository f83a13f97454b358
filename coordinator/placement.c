/*
 * placement.c - see placement.h.
 */
#include "placement.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

int place_parse_hosts(const char *spec, struct place_spec_entry *out, int max, char *err,
                      size_t errlen)
{
    int n = 0;
    const char *p = spec;
    while (p && *p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char item[PLACE_MAX_HOST_NAME + 16];
        if (len == 0 || len >= sizeof(item)) {
            snprintf(err, errlen, "invalid host list entry in '%s'", spec);
            return -1;
        }
        memcpy(item, p, len);
        item[len] = '\0';
        char *colon = strrchr(item, ':');
        long slots = 1;
        if (colon) {
            char *e;
            *colon = '\0';
            slots = strtol(colon + 1, &e, 10);
            if (colon[1] == '\0' || *e != '\0' || slots < 1 || slots > 1 << 20) {
                snprintf(err, errlen, "invalid slot count in host list entry '%.*s'", (int)len, p);
                return -1;
            }
        }
        for (const char *c = item; *c; c++) {
            if (!isalnum((unsigned char)*c) && *c != '.' && *c != '-' && *c != '_') {
                snprintf(err, errlen, "invalid host name in host list entry '%.*s'", (int)len, p);
                return -1;
            }
        }
        if (item[0] == '\0') {
            snprintf(err, errlen, "empty host name in host list '%s'", spec);
            return -1;
        }
        if (n == max) {
            snprintf(err, errlen, "host list has more than %d entries", max);
            return -1;
        }
        for (int i = 0; i < n; i++) {
            if (strcmp(out[i].name, item) == 0) {
                snprintf(err, errlen, "host '%s' appears twice in the host list", item);
                return -1;
            }
        }
        str_copy(out[n].name, item, sizeof(out[n].name));
        out[n].slots = (int)slots;
        n++;
        p = end ? end + 1 : NULL;
    }
    return n;
}

static int host_matches(const struct place_host *h, const char *name)
{
    return (h->name && strcmp(h->name, name) == 0) ||
           (h->hostname && strcmp(h->hostname, name) == 0) || (h->id && strcmp(h->id, name) == 0);
}

/* Fills local and cross ranks once every rank has its host. */
static void place_fill_topology(struct place_rank *out, int np, int nhosts)
{
    int *count = calloc((size_t)nhosts, sizeof(int));
    int *order = calloc((size_t)nhosts, sizeof(int)); /* hosts in first-rank order */
    int nused = 0;
    for (int r = 0; r < np; r++) {
        int h = out[r].host;
        if (count[h] == 0)
            order[nused++] = h;
        out[r].rank = r;
        out[r].local_rank = count[h]++;
    }
    for (int r = 0; r < np; r++) {
        out[r].local_size = count[out[r].host];
        int cross_rank = 0, cross_size = 0;
        for (int i = 0; i < nused; i++) {
            if (count[order[i]] > out[r].local_rank) {
                if (order[i] == out[r].host)
                    cross_rank = cross_size;
                cross_size++;
            }
        }
        out[r].cross_rank = cross_rank;
        out[r].cross_size = cross_size;
    }
    free(count);
    free(order);
}

int place_ranks(const struct place_host *hosts, int nhosts, const struct place_spec_entry *spec,
                int nspec, int np, struct place_rank *out, char *err, size_t errlen)
{
    int r = 0;
    if (np < 1) {
        snprintf(err, errlen, "np must be at least 1");
        return PLACE_IMPOSSIBLE;
    }
    if (spec && nspec > 0) {
        int total = 0;
        for (int i = 0; i < nspec; i++)
            total += spec[i].slots;
        if (total < np) {
            snprintf(err, errlen, "the host list has %d slot(s) but np is %d", total, np);
            return PLACE_IMPOSSIBLE;
        }
        for (int i = 0; i < nspec && r < np; i++) {
            int h;
            for (h = 0; h < nhosts; h++)
                if (hosts[h].alive && host_matches(&hosts[h], spec[i].name))
                    break;
            if (h == nhosts) {
                snprintf(err, errlen, "waiting for host '%s' (no live agent with that name)",
                         spec[i].name);
                return PLACE_WAIT;
            }
            int want = spec[i].slots < np - r ? spec[i].slots : np - r;
            if (hosts[h].free_slots < want) {
                snprintf(err, errlen, "waiting for slots on host '%s': %d needed, %d free",
                         spec[i].name, want, hosts[h].free_slots);
                return PLACE_WAIT;
            }
            for (int k = 0; k < want; k++)
                out[r++].host = h;
        }
    } else {
        int free_total = 0, alive = 0;
        for (int h = 0; h < nhosts; h++) {
            if (!hosts[h].alive)
                continue;
            alive++;
            free_total += hosts[h].free_slots > 0 ? hosts[h].free_slots : 0;
        }
        if (free_total < np) {
            snprintf(err, errlen, "waiting for slots: the job needs %d, %d free on %d live host(s)",
                     np, free_total, alive);
            return PLACE_WAIT;
        }
        for (int h = 0; h < nhosts && r < np; h++) {
            if (!hosts[h].alive)
                continue;
            for (int k = 0; k < hosts[h].free_slots && r < np; k++)
                out[r++].host = h;
        }
    }
    place_fill_topology(out, np, nhosts);
    return PLACE_OK;
}
