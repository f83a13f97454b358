/*
 * placement.h - rank assignment, host by host, as horovodrun does it.
 *
 * Ranks fill the first host's slots, then the next host's, in the order
 * given (the -H list, or the hosts' registration order). local_rank counts
 * ranks on one host; cross_rank of a rank is the index of its host among
 * the hosts that have a rank with the same local_rank, and cross_size is
 * the number of such hosts. Pure functions: no I/O, unit-tested alone.
 */
#ifndef KOLO_COORDINATOR_PLACEMENT_H
#define KOLO_COORDINATOR_PLACEMENT_H

#include <stddef.h>

#define PLACE_MAX_HOST_NAME 128

struct place_host {
    const char *name;     /* agent name, matched against -H entries */
    const char *hostname; /* also accepted in -H */
    const char *id;       /* also accepted in -H */
    int free_slots;
    int alive;
};

struct place_spec_entry {
    char name[PLACE_MAX_HOST_NAME];
    int slots;
};

struct place_rank {
    int rank;
    int host; /* index into the hosts array */
    int local_rank, local_size;
    int cross_rank, cross_size;
};

/* place_parse_hosts parses "h1:2,h2:2" (horovodrun's -H; a bare name
 * means one slot). Returns the count, or -1 with a message in err. */
int place_parse_hosts(const char *spec, struct place_spec_entry *out, int max, char *err,
                      size_t errlen);

/*
 * place_ranks assigns np ranks. spec may be NULL (use hosts in order) or
 * the parsed -H list. Returns 0 and fills out[np]; PLACE_WAIT when the
 * slots are not there yet (a reason in err: the job should wait); or
 * PLACE_IMPOSSIBLE when it never can be placed as asked (err says why).
 */
enum { PLACE_OK = 0, PLACE_WAIT = 1, PLACE_IMPOSSIBLE = 2 };
int place_ranks(const struct place_host *hosts, int nhosts, const struct place_spec_entry *spec,
                int nspec, int np, struct place_rank *out, char *err, size_t errlen);

#endif
