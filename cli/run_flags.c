/*
 * run_flags.c - kolo run's flags: its own and horovodrun's, so that an
 * existing `horovodrun ...` line works as `kolo run ...`.
 *
 * DESIGN. Everything goes through the one knob table (common/knobs.h), so
 * a horovodrun flag has the same syntax, errors, --help line and priority
 * as kolo's own. horovodrun's flags come in three kinds:
 *
 *   - flags kolo implements: -np, -H, --hostfile, --start-timeout (a plain
 *     number is seconds, as in horovodrun), --output-filename, --verbose,
 *     --log-level, --config-file;
 *   - flags that only set a variable in the job's environment, because the
 *     library reads the variable (HOROVOD_FUSION_THRESHOLD, the stall
 *     check) or because the coordinator does (HOROVOD_TIMELINE); run_job_env
 *     builds them and run.c lets them override what the job inherits;
 *   - flags about machinery kolo does not have (SSH, MPI, Gloo, NIC
 *     probing, autotuning): KNOB_IGNORED entries, accepted with their value
 *     and each reported once on stderr, so the run goes on and the user
 *     learns the flag did nothing.
 *
 * Elastic flags are horovodrun's: --min-np, --max-np,
 * --host-discovery-script, --reset-limit, --blacklist-cooldown-range LO HI
 * (two words, as horovodrun takes them; run.c joins them before parsing)
 * and --elastic-timeout. Any of min-np, max-np or a discovery script makes
 * the job elastic; --slots then also sizes discovery lines without ":N".
 *
 * horovodrun's --config-file is YAML. kolo reads the part of YAML such
 * files use: `key: value` lines at the top level (horovodrun's option
 * names, e.g. fusion_threshold_mb: 32), and one level of sections as
 * Horovod's own config parser reads them (params, autotune, timeline,
 * stall_check, library_options, logging). No lists, no nesting deeper than
 * that, no multi-line values. The loader sets knobs at config-file
 * priority, so a flag given on the command line wins.
 */
#include "run.h"
#include "tls.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "errors.h"
#include "log.h"
#include "util.h"

/* A horovodrun YAML file is a page of settings. */
#define YAML_MAX (1u << 20)

/* ------------------------------------------------------------ YAML subset */

/* Horovod's sections, and the prefix its parser puts before each key to
 * get the option name (stall_check: {warning_time_seconds: 60} is
 * --stall-check-warning-time-seconds). "enabled" names the section's own
 * switch. */
static const struct {
    const char *section, *prefix, *enabled;
} yaml_sections[] = {
    {"params", "", NULL},
    {"autotune", "autotune_", "autotune"},
    {"timeline", "timeline_", NULL},
    {"stall_check", "stall_check_", "stall_check"},
    {"library_options", "", NULL},
    {"logging", "log_", NULL},
};

/* Option names whose argparse dest differs from the flag, and the two
 * that mean the opposite of the knob they set. */
static const struct {
    const char *key, *knob;
    bool invert;
} yaml_renames[] = {
    {"num_proc", "np", false},
    {"no_stall_check", "stall-check", true},
    {"log_with_timestamp", "log-without-timestamp", true},
    {"use_gloo", "gloo", false},
    {"use_mpi", "mpi", false},
    {"use_jsrun", "jsrun", false},
    {"nics", "network-interfaces", false},
    {"tcp_flag", "tcp", false},
};

/* yaml_scalar turns the text after "key:" into its value in place: a
 * comment (a '#' after whitespace) is dropped and one pair of quotes is
 * removed. NULL for what this subset does not read (lists, maps, blocks,
 * anchors, a quote that is not closed). */
static char *yaml_scalar(char *v)
{
    v = knobs_trim(v);
    if (*v == '"' || *v == '\'') {
        char *close = strchr(v + 1, *v);
        if (!close)
            return NULL;
        char *after = knobs_trim(close + 1);
        if (*after && *after != '#')
            return NULL;
        *close = '\0';
        return v + 1;
    }
    for (char *c = v; *c; c++)
        if (*c == '#' && (c == v || c[-1] == ' ' || c[-1] == '\t')) {
            *c = '\0';
            break;
        }
    v = knobs_trim(v);
    if (*v && strchr("[{|>&*!", *v))
        return NULL;
    return v;
}

/* yaml_apply sets the knob that key (inside section, or at the top level
 * when section is NULL) names. */
static int yaml_apply(struct knob *tab, size_t n, const char *section, const char *key,
                      const char *value, const char *where, char *err, size_t errlen)
{
    char name[128];
    bool invert = false;
    snprintf(name, sizeof name, "%s", key);
    if (section) {
        for (size_t i = 0; i < sizeof yaml_sections / sizeof yaml_sections[0]; i++) {
            if (strcmp(section, yaml_sections[i].section) != 0)
                continue;
            if (yaml_sections[i].enabled && strcmp(key, "enabled") == 0)
                snprintf(name, sizeof name, "%s", yaml_sections[i].enabled);
            else
                snprintf(name, sizeof name, "%s%s", yaml_sections[i].prefix, key);
        }
    } else if (strcmp(key, "controller") == 0) {
        fprintf(stderr, "[kolo] controller is not needed by kolo (kolo has its own "
                        "coordinator); ignored\n");
        return 0;
    }
    for (size_t i = 0; i < sizeof yaml_renames / sizeof yaml_renames[0]; i++)
        if (strcmp(name, yaml_renames[i].key) == 0) {
            snprintf(name, sizeof name, "%s", yaml_renames[i].knob);
            invert = yaml_renames[i].invert;
        }
    for (char *c = name; *c; c++)
        if (*c == '_')
            *c = '-';

    struct knob *k = knobs_find(tab, n, name);
    if (!k) {
        snprintf(err, errlen, "%s: unknown setting '%s'", where, key);
        return KOLO_EINVAL;
    }
    if (k->loader) {
        snprintf(err, errlen, "%s: a config file cannot name another one", where);
        return KOLO_EINVAL;
    }
    if (invert) {
        bool on;
        if (strcasecmp(value, "true") == 0 || strcasecmp(value, "yes") == 0 ||
            strcasecmp(value, "on") == 0 || strcmp(value, "1") == 0)
            on = true;
        else if (strcasecmp(value, "false") == 0 || strcasecmp(value, "no") == 0 ||
                 strcasecmp(value, "off") == 0 || strcmp(value, "0") == 0)
            on = false;
        else {
            snprintf(err, errlen, "%s: '%s' is not a boolean (want true or false)", where, value);
            return KOLO_EINVAL;
        }
        value = on ? "false" : "true";
    }
    return knobs_set(k, value, where, err, errlen);
}

/* run_load_yaml is the loader of --config-file. */
static int run_load_yaml(struct knob *tab, size_t n, const char *path, char *err, size_t errlen)
{
    char *text;
    if (knobs_read_text(path, YAML_MAX, "config-file", &text, err, errlen) != 0)
        return KOLO_EINVAL;
    char section[64] = "";
    int section_indent = -1;
    char *line = text;
    int rc = 0;
    for (int lineno = 1; line && *line && rc == 0; lineno++) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        char *next = nl ? nl + 1 : NULL;
        char where[4200];
        snprintf(where, sizeof where, "config-file %s:%d", path, lineno);

        char *raw = line;
        int indent = (int)strspn(raw, " ");
        char *s = knobs_trim(raw);
        line = next;
        if (*s == '\0' || *s == '#' || strcmp(s, "---") == 0 || strcmp(s, "...") == 0)
            continue;
        if (s - raw != indent) {
            snprintf(err, errlen, "%s: YAML does not allow tabs for indentation", where);
            rc = KOLO_EINVAL;
            break;
        }
        char *colon = strchr(s, ':');
        while (colon && colon[1] && colon[1] != ' ' && colon[1] != '\t')
            colon = strchr(colon + 1, ':');
        if (!colon || colon == s || *s == '-') {
            snprintf(err, errlen, "%s: expected 'key: value'", where);
            rc = KOLO_EINVAL;
            break;
        }
        *colon = '\0';
        char *key = knobs_trim(s);
        for (char *c = key; *c; c++)
            if (!isalnum((unsigned char)*c) && *c != '_' && *c != '-') {
                snprintf(err, errlen, "%s: '%s' is not a setting name", where, key);
                rc = KOLO_EINVAL;
                break;
            }
        if (rc)
            break;
        char *value = yaml_scalar(colon + 1);
        if (!value) {
            snprintf(err, errlen, "%s: only plain values are supported (no lists or maps)", where);
            rc = KOLO_EINVAL;
            break;
        }

        if (indent == 0) {
            section[0] = '\0';
            section_indent = -1;
            if (*value == '\0') {
                /* A section header. */
                bool known = false;
                for (size_t i = 0; i < sizeof yaml_sections / sizeof yaml_sections[0]; i++)
                    known = known || strcmp(key, yaml_sections[i].section) == 0;
                if (!known) {
                    snprintf(err, errlen, "%s: unknown section '%s'", where, key);
                    rc = KOLO_EINVAL;
                    break;
                }
                snprintf(section, sizeof section, "%s", key);
                continue;
            }
        } else {
            if (!section[0]) {
                snprintf(err, errlen, "%s: indented line outside a section", where);
                rc = KOLO_EINVAL;
                break;
            }
            if (section_indent < 0)
                section_indent = indent;
            if (indent != section_indent) {
                snprintf(err, errlen, "%s: nesting deeper than one section is not supported",
                         where);
                rc = KOLO_EINVAL;
                break;
            }
        }
        /* YAML's null leaves the setting alone, as in horovodrun. */
        if (*value == '\0' || strcmp(value, "~") == 0 || strcasecmp(value, "null") == 0)
            continue;
        rc = yaml_apply(tab, n, indent ? section : NULL, key, value, where, err, errlen);
    }
    free(text);
    return rc ? KOLO_EINVAL : 0;
}

/* ------------------------------------------------------------ the table */

/* An accepted, ignored horovodrun flag; why is the reason shown by --help
 * and in the note. */
#define IGNORED(name, alias, type, why)                                                            \
    {                                                                                              \
        name, alias, "", type, NULL, 1, 0, why, NULL, .flags = KNOB_IGNORED                        \
    }
#define NO_SSH      "no SSH: kolo agents start the workers"
#define NO_MPI      "no MPI"
#define NO_AUTOTUNE "no autotuner"
#define SHM_ALREADY "shared memory within a host is automatic"

size_t run_flags_table(struct knob *tab, struct run_opts *o)
{
    const struct knob t[] = {
        {"np", "-np --num-proc", "", KNOB_INT, NULL, 1, 65536,
         "number of worker processes; required", &o->np},
        {"hosts", "-H", "", KNOB_STR, NULL, 0, -1,
         "hosts and slots to use, host1:2,host2:2; unset: any agent's free slots (without "
         "--coordinator only this machine: localhost or its hostname)",
         &o->hosts},
        {"hostfile", "-hostfile", "", KNOB_STR, NULL, 0, -1,
         "file of '<host> slots=<n>' lines, '#' comments; instead of -H", &o->hostfile},
        {"start-timeout", NULL, "HOROVOD_START_TIMEOUT", KNOB_SECONDS, "30s", 0, 86400000,
         "fail if the job cannot be placed within this time (a plain number is seconds; 0 "
         "waits forever)",
         &o->start_timeout},
        {"output-filename", NULL, "", KNOB_STR, NULL, 0, -1,
         "also write each rank's output to DIR/rank.<N>/stdout and DIR/rank.<N>/stderr",
         &o->output_filename},
        {"slurm", NULL, "", KNOB_BOOL, "false", 0, -1,
         "run on the Slurm allocation this runs in: one agent per node through srun, ranks "
         "placed by the allocation (on by itself inside salloc/sbatch without --coordinator; "
         "--no-slurm keeps the job on this machine)",
         &o->slurm},
        {"detach", "-d", "", KNOB_BOOL, "false", 0, -1,
         "submit to --coordinator, print the job id and return (kolo attach JOB follows it, "
         "kolo logs JOB shows its output)",
         &o->detach},
        {"raw", NULL, "", KNOB_BOOL, "false", 0, -1,
         "print the job's output bytes as they are even on a terminal (by default a "
         "terminal gets its control bytes, escape sequences included, as \\xNN)",
         &o->raw},
        {"verbose", NULL, "", KNOB_BOOL, "false", 0, -1,
         "log what the embedded coordinator and agent do", &o->verbose},
        {"quiet", "-q", "", KNOB_BOOL, "false", 0, -1,
         "no [kolo] line for elastic events (a worker lost, a new generation, a host "
         "excluded, a recovery's timeline); stalls, their verdicts and the outcome still print",
         &o->quiet},
        {"log-level", NULL, "KOLO_LOG_LEVEL", KNOB_STR, "warn", 0, -1,
         "trace, debug, info, warn[ing], error, fatal or off, any case; from a flag or a "
         "config file, also the job's KOLO_LOG_LEVEL and HOROVOD_LOG_LEVEL",
         &o->log_level},
        {"config-file", NULL, "", KNOB_STR, NULL, 0, -1,
         "horovodrun's YAML settings: 'key: value' lines with horovodrun's option names, or "
         "its sections; flags win",
         &o->config_file, .loader = run_load_yaml},
        {"fusion-threshold-mb", NULL, "", KNOB_INT, NULL, 0, 1 << 20,
         "tensor fusion buffer in MiB, 0 disables fusion; sets HOROVOD_FUSION_THRESHOLD "
         "(bytes) for the job",
         &o->fusion_threshold_mb},
        {"cycle-time-ms", NULL, "", KNOB_STR, NULL, 0, -1,
         "accepted for compatibility, kolo has no cycle; sets HOROVOD_CYCLE_TIME for the job",
         &o->cycle_time_ms},
        {"cache-capacity", NULL, "", KNOB_INT, NULL, 0, INT32_MAX,
         "sets HOROVOD_CACHE_CAPACITY for the job (kolo's response cache has a fixed size)",
         &o->cache_capacity},
        {"stall-check", NULL, "", KNOB_BOOL, "true", 0, -1,
         "warn about collectives that some ranks never submit; false sets "
         "HOROVOD_STALL_CHECK_DISABLE=1 for the job",
         &o->stall_check},
        {"stall-check-warning-time-seconds", NULL, "", KNOB_INT, NULL, 0, INT32_MAX / 1000,
         "seconds before a stall warning; sets HOROVOD_STALL_CHECK_TIME_SECONDS (kolo's default "
         "60)",
         &o->stall_warning_s},
        {"stall-check-shutdown-time-seconds", NULL, "", KNOB_INT, NULL, 0, INT32_MAX / 1000,
         "seconds before a stall fails the job's collectives (0: never); sets "
         "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
         &o->stall_shutdown_s},
        {"timeline-filename", NULL, "", KNOB_STR, NULL, 0, -1,
         "rank 0 writes a Chrome-trace timeline of the job's negotiation to this path on its "
         "host (HOROVOD_TIMELINE; relative: to the job's cwd)",
         &o->timeline_filename},
        {"encrypt-data", NULL, "", KNOB_BOOL, "false", 0, -1,
         "seal the job's TCP data plane with AES-256-GCM (needs libssl3 on every host; "
         "shared memory is unchanged); sets KOLO_DATA_ENCRYPT for the job",
         &o->encrypt_data},

        {"min-np", "--min-num-proc", "", KNOB_INT, NULL, 1, 65536,
         "elastic: keep running while at least this many workers are alive; unset: -np",
         &o->min_np},
        {"max-np", "--max-num-proc", "", KNOB_INT, NULL, 1, 65536,
         "elastic: grow up to this many workers when capacity appears; unset: -np", &o->max_np},
        {"host-discovery-script", NULL, "", KNOB_STR, NULL, 0, -1,
         "elastic: a script printing 'host' or 'host:slots' lines, run every second by the "
         "coordinator; only the hosts it lists are used",
         &o->discovery},
        {"reset-limit", NULL, "", KNOB_INT, "0", 0, 1000000,
         "elastic: fail the job after this many resets (0: no limit)", &o->reset_limit},
        {"blacklist-cooldown-range", NULL, "", KNOB_STR, NULL, 0, -1,
         "elastic: LO HI seconds; a host whose worker failed returns after LO, 2 LO, 4 LO ... "
         "(jittered, at most HI); without it the host stays out",
         &o->cooldown_range},
        {"elastic-timeout", NULL, "HOROVOD_ELASTIC_TIMEOUT", KNOB_SECONDS, "600s", 0, 86400000,
         "elastic: how long to wait for min-np slots before failing", &o->elastic_timeout},
        {"spares", NULL, "", KNOB_INT, "0", 0, 1024,
         "elastic: keep this many extra workers started, waiting in hvd.init(); a lost rank's "
         "place goes to one of them, no process start",
         &o->spares},
        {"straggler-policy", NULL, "", KNOB_STR, "warn", 0, -1,
         "a host whose ranks cost the job's steps 15 % or more for --straggler-window: warn "
         "(an event and a [kolo] line) or exclude (elastic: also drain it from the job for its "
         "cooldown, if the job keeps --min-np)",
         &o->straggler_policy},
        {"straggler-window", NULL, "", KNOB_DURATION, "2m", 1000, 86400000,
         "how long a host must cost the job before --straggler-policy acts", &o->straggler_window},

        {"coordinator", NULL, "KOLO_RUN_COORDINATOR", KNOB_STR, NULL, 0, -1,
         "submit to this coordinator (tcp://HOST:PORT) instead of an embedded one",
         &o->coordinator},
        {"token-file", NULL, NULL, KNOB_STR, NULL, 0, -1, "file holding the cluster token",
         &o->token_file},
        TLS_KNOBS(o->tls_cert, o->tls_key, o->tls_ca, o->tls_dir),
        {"name", NULL, "", KNOB_STR, NULL, 0, -1, "job name (default: the command)", &o->name},
        {"metadata", NULL, "", KNOB_STR, NULL, 0, -1,
         "labels of the job, a JSON object of strings ('{\"team\": \"vision\"}'): REST and the "
         "dashboard show them (kolo tune labels its trials kolo.study, kolo.trial, ...)",
         &o->metadata},
        {"http", NULL, "", KNOB_STR, "127.0.0.1:0", 0, -1,
         "embedded coordinator: HTTP address of REST and the dashboard", &o->http},
        {"slots", "--slots-per-host", "", KNOB_INT, NULL, 1, 65536,
         "embedded agent: slots (unset: the larger of -np, max-np and the CPU count); elastic: "
         "slots of a discovery line without ':N'",
         &o->slots},
        {"state-dir", NULL, NULL, KNOB_STR, NULL, 0, -1,
         "embedded coordinator: directory of run databases (default $XDG_STATE_HOME/kolo)",
         &o->state_dir},
        {"stop-grace", NULL, "", KNOB_DURATION, "5s", 0, 3600000,
         "embedded agent: SIGTERM -> SIGKILL grace when stopping workers", &o->grace},
        {"version", "-v", "", KNOB_BOOL, NULL, 0, -1, "print kolo's version and exit", &o->version,
         .flags = KNOB_ACTION},
        {"check-build", "-cb", "", KNOB_BOOL, NULL, 0, -1,
         "print which frameworks, controllers and tensor operations kolo has, and exit",
         &o->check_build, .flags = KNOB_ACTION},

        IGNORED("ssh-port", "-p", KNOB_STR, NO_SSH),
        IGNORED("ssh-identity-file", "-i", KNOB_STR, NO_SSH),
        IGNORED("network-interfaces", "--network-interface", KNOB_STR,
                "workers pick their address; KOLO_DATA_ADDR sets it"),
        IGNORED("gloo", NULL, KNOB_BOOL, "kolo has its own coordinator"),
        IGNORED("mpi", NULL, KNOB_BOOL, "kolo has its own coordinator"),
        IGNORED("jsrun", NULL, KNOB_BOOL, "kolo agents start the workers"),
        IGNORED("mpi-args", NULL, KNOB_STR, NO_MPI),
        IGNORED("tcp", NULL, KNOB_BOOL, "kolo uses TCP between hosts already"),
        IGNORED("binding-args", NULL, KNOB_STR, NO_MPI),
        IGNORED("mpi-threads-disable", NULL, KNOB_BOOL, NO_MPI),
        IGNORED("num-nccl-streams", NULL, KNOB_STR,
                "the NCCL backend runs every op on one stream per rank"),
        IGNORED("thread-affinity", NULL, KNOB_STR, "the background thread is not pinned"),
        IGNORED("gloo-timeout-seconds", NULL, KNOB_STR,
                "no Gloo; KOLO_TIMEOUT_MS bounds rendezvous and transfers"),
        IGNORED("disable-cache", NULL, KNOB_BOOL, "no start-up checks to cache"),
        IGNORED("hierarchical-allreduce", NULL, KNOB_BOOL, SHM_ALREADY),
        IGNORED("hierarchical-allgather", NULL, KNOB_BOOL, SHM_ALREADY),
        IGNORED("torus-allreduce", NULL, KNOB_BOOL, SHM_ALREADY),
        IGNORED("autotune", NULL, KNOB_BOOL, NO_AUTOTUNE),
        IGNORED("autotune-log-file", NULL, KNOB_STR, NO_AUTOTUNE),
        IGNORED("autotune-warmup-samples", NULL, KNOB_STR, NO_AUTOTUNE),
        IGNORED("autotune-steps-per-sample", NULL, KNOB_STR, NO_AUTOTUNE),
        IGNORED("autotune-bayes-opt-max-samples", NULL, KNOB_STR, NO_AUTOTUNE),
        IGNORED("autotune-gaussian-process-noise", NULL, KNOB_STR, NO_AUTOTUNE),
        IGNORED("timeline-mark-cycles", NULL, KNOB_BOOL, "no cycles"),
        IGNORED("log-without-timestamp", NULL, KNOB_BOOL, "kolo's log lines keep their timestamp"),
        IGNORED("prefix-output-with-timestamp", "-prefix-timestamp", KNOB_BOOL,
                "kolo run prefixes output with rank and stream only"),
    };
    size_t n = sizeof t / sizeof t[0];
    _Static_assert(sizeof t / sizeof t[0] <= RUN_MAX_KNOBS, "RUN_MAX_KNOBS is too small");
    memcpy(tab, t, sizeof t);
    return n;
}

/* ------------------------------------------------------------ after parsing */

static struct knob *knob_named(struct knob *tab, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(tab[i].name, name) == 0)
            return &tab[i];
    return NULL;
}

/* from_user says whether the user set k on the command line or in a
 * config file: what kolo run passes on to the job. The environment is
 * left out because the job inherits it anyway. */
static bool from_user(struct knob *tab, size_t n, const char *name)
{
    const struct knob *k = knob_named(tab, n, name);
    return k && knobs_given(k) && strcmp(k->source, "env") != 0;
}

/* hostfile_read turns a horovodrun host file into -H's form. A line is
 * "<host> slots=<n>" or just "<host>" (one slot, as with -H host). */
static int hostfile_read(const char *path, char **hosts, char *err, size_t errlen)
{
    char *text;
    size_t len;
    int rc = read_file_all(path, &text, &len, YAML_MAX);
    if (rc) {
        snprintf(err, errlen, "--hostfile %s: %s", path,
                 rc == KOLO_ENOTFOUND ? "no such file" : abi_strerror(rc));
        return KOLO_EINVAL;
    }
    /* "h" becomes ",h:1": at most three times the input, plus a little. */
    size_t cap = 3 * len + 16, used = 0;
    char *out = malloc(cap);
    if (!out) {
        free(text);
        snprintf(err, errlen, "out of memory");
        return KOLO_ENOMEM;
    }
    out[0] = '\0';
    rc = 0;
    char *line = text;
    for (int lineno = 1; line && *line && rc == 0; lineno++) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        char *next = nl ? nl + 1 : NULL;
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        char *save = NULL;
        char *host = strtok_r(line, " \t\r", &save);
        char *slots = host ? strtok_r(NULL, " \t\r", &save) : NULL;
        char *extra = slots ? strtok_r(NULL, " \t\r", &save) : NULL;
        line = next;
        if (!host)
            continue;
        bool ok = !extra;
        for (const char *c = host; *c && ok; c++)
            ok = isalnum((unsigned char)*c) || *c == '.' || *c == '-' || *c == '_';
        long nslots = 1;
        if (ok && slots) {
            char *end = slots;
            errno = 0;
            ok = strncmp(slots, "slots=", 6) == 0 && isdigit((unsigned char)slots[6]);
            if (ok)
                nslots = strtol(slots + 6, &end, 10);
            ok = ok && errno == 0 && *end == '\0' && nslots >= 1 && nslots <= 65536;
        }
        if (!ok) {
            snprintf(err, errlen, "--hostfile %s:%d: expected '<host> slots=<n>'", path, lineno);
            rc = KOLO_EINVAL;
            break;
        }
        int w = snprintf(out + used, cap - used, "%s%s:%ld", used ? "," : "", host, nslots);
        if (w < 0 || (size_t)w >= cap - used) {
            snprintf(err, errlen, "--hostfile %s: too long", path);
            rc = KOLO_EINVAL;
            break;
        }
        used += (size_t)w;
    }
    free(text);
    if (rc == 0 && used == 0) {
        snprintf(err, errlen, "--hostfile %s: no hosts in it", path);
        rc = KOLO_EINVAL;
    }
    if (rc) {
        free(out);
        return rc;
    }
    *hosts = out;
    return 0;
}

/* embedded_hosts_check refuses a host list that names a host other than
 * this machine when the run has no --coordinator: its embedded agent,
 * named "localhost" with this machine's hostname, is the only host it
 * will ever have, so the job would wait out --start-timeout for nothing.
 * Malformed entries are left to the coordinator's parser. */
static int embedded_hosts_check(const char *hosts, char *err, size_t errlen)
{
    char self[256] = "";
    if (gethostname(self, sizeof self - 1) != 0)
        self[0] = '\0';
    for (const char *p = hosts; *p;) {
        size_t len = strcspn(p, ","), name = strcspn(p, ":,");
        bool here = (name == 9 && strncmp(p, "localhost", 9) == 0) ||
                    (self[0] && name == strlen(self) && strncmp(p, self, name) == 0);
        if (name > 0 && !here) {
            snprintf(err, errlen,
                     "-H names host '%.*s', which a run without --coordinator never has: its "
                     "one host is this machine (localhost%s%s); to run on other hosts, give "
                     "--coordinator of their cluster",
                     (int)(name > 64 ? 64 : name), p, self[0] ? " or " : "", self);
            return KOLO_EINVAL;
        }
        p += len + (p[len] == ',');
    }
    return 0;
}

#define LEVELS "trace, debug, info, warn[ing], error, fatal or off"

/* A number Horovod reads with atof: digits with at most one point. */
static bool plain_decimal(const char *s)
{
    int digits = 0, points = 0;
    for (; *s; s++) {
        if (isdigit((unsigned char)*s))
            digits++;
        else if (*s == '.' && points == 0)
            points++;
        else
            return false;
    }
    return digits > 0;
}

int run_flags_finish(struct knob *tab, size_t n, struct run_opts *o, char *err, size_t errlen)
{
    if (o->cooldown_range) {
        unsigned lo = 0, hi = 0;
        char extra;
        if (sscanf(o->cooldown_range, "%u%*[ ,]%u %c", &lo, &hi, &extra) != 2 || lo < 1 ||
            hi > 3600 || lo > hi) {
            snprintf(err, errlen,
                     "blacklist-cooldown-range: '%s' is not LO HI seconds with 1 <= LO <= HI "
                     "<= 3600",
                     o->cooldown_range);
            return KOLO_EINVAL;
        }
        o->cooldown_lo_s = lo;
        o->cooldown_hi_s = hi;
    }
    o->elastic = o->min_np > 0 || o->max_np > 0 || (o->discovery && o->discovery[0]);
    if (o->elastic) {
        int64_t lo = o->min_np ? o->min_np : o->np, hi = o->max_np ? o->max_np : o->np;
        if (o->np && (lo > o->np || o->np > hi)) {
            snprintf(err, errlen, "elastic sizes must satisfy min-np <= np <= max-np (got %lld, "
                     "%lld, %lld)", (long long)lo, (long long)o->np, (long long)hi);
            return KOLO_EINVAL;
        }
    }
    bool remote = o->coordinator && o->coordinator[0];
    /* Inside salloc/sbatch, the allocation is where to run, unless the
     * user said otherwise (--no-slurm, or a coordinator of their own). */
    if (!o->slurm && strcmp(knob_named(tab, n, "slurm")->source, "default") == 0 && !remote &&
        slurm_in_allocation())
        o->slurm = true;
    if (o->slurm && remote) {
        snprintf(err, errlen, "--slurm starts its own coordinator; it cannot be used with "
                              "--coordinator");
        return KOLO_EINVAL;
    }
    if (o->detach && !(o->coordinator && o->coordinator[0])) {
        snprintf(err, errlen, "--detach needs --coordinator: an embedded coordinator ends with "
                              "kolo run");
        return KOLO_EINVAL;
    }
    const struct knob *lk = knob_named(tab, n, "log-level");
    if (o->log_level && log_parse_level(o->log_level) < 0) {
        /* A stray variable in the shell is reported, as libkolo does,
         * not made fatal; a flag or a config line is a usage error. */
        if (lk && strcmp(lk->source, "env") == 0) {
            fprintf(stderr, "[kolo] ignoring KOLO_LOG_LEVEL=%s (want %s)\n", o->log_level, LEVELS);
        } else {
            snprintf(err, errlen, "log-level: '%s' is not a level (want %s)", o->log_level, LEVELS);
            return KOLO_EINVAL;
        }
    }
    if (o->cycle_time_ms && !plain_decimal(o->cycle_time_ms)) {
        snprintf(err, errlen, "cycle-time-ms: '%s' is not a number of milliseconds",
                 o->cycle_time_ms);
        return KOLO_EINVAL;
    }
    if (o->hostfile && o->hosts) {
        /* One from the command line beats the other from a config file. */
        const char *hs = knob_named(tab, n, "hosts")->source;
        const char *fs = knob_named(tab, n, "hostfile")->source;
        if (strcmp(hs, "flag") == 0 && strcmp(fs, "flag") != 0) {
            free(o->hostfile);
            o->hostfile = NULL;
        } else if (strcmp(fs, "flag") == 0 && strcmp(hs, "flag") != 0) {
            free(o->hosts);
            o->hosts = NULL;
        } else {
            snprintf(err, errlen, "-H/--hosts and --hostfile cannot be used together");
            return KOLO_EINVAL;
        }
    }
    if (o->hostfile) {
        int rc = hostfile_read(o->hostfile, &o->hosts, err, errlen);
        if (rc)
            return rc;
    }
    if (!remote && !o->slurm && !(o->discovery && o->discovery[0]) && o->hosts &&
        embedded_hosts_check(o->hosts, err, errlen) != 0)
        return KOLO_EINVAL;
    for (size_t i = 0; i < n; i++)
        if ((tab[i].flags & KNOB_IGNORED) && knobs_given(&tab[i]))
            fprintf(stderr, "[kolo] --%s is not needed by kolo (%s); ignored\n", tab[i].name,
                    tab[i].help);
    return 0;
}

int run_flags_log_level(const struct run_opts *o)
{
    int lvl = log_parse_level(o->log_level);
    return o->verbose ? LOG_INFO : (lvl < 0 ? LOG_WARN : lvl);
}

/* ------------------------------------------------------------ job environment */

/* Horovod's name for a level; "fatal" stays fatal, and off (which Horovod
 * lacks) comes closest as fatal. */
static const char *horovod_level(const char *text)
{
    static const char *const names[] = {"TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"};
    if (strcasecmp(text, "fatal") == 0)
        return "FATAL";
    int lvl = log_parse_level(text);
    return lvl >= 0 && lvl <= LOG_OFF ? names[lvl] : "WARNING";
}

static int env_add(char ***env, size_t *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int env_add(char ***env, size_t *n, const char *fmt, ...)
{
    char **grown = realloc(*env, (*n + 2) * sizeof(char *));
    if (!grown)
        return KOLO_ENOMEM;
    *env = grown;
    va_list ap;
    va_start(ap, fmt);
    int rc = vasprintf(&grown[*n], fmt, ap);
    va_end(ap);
    if (rc < 0)
        return KOLO_ENOMEM;
    grown[++*n] = NULL;
    return 0;
}

char **run_job_env(struct knob *tab, size_t n, const struct run_opts *o)
{
    char **env = calloc(1, sizeof(char *));
    size_t k = 0;
    int rc = env ? 0 : KOLO_ENOMEM;
    if (!rc && from_user(tab, n, "fusion-threshold-mb")) {
        /* libkolo reads KOLO_FUSION_THRESHOLD first: set both, or an
         * inherited KOLO_ value would beat the flag. */
        long long bytes = (long long)o->fusion_threshold_mb << 20;
        rc = env_add(&env, &k, "HOROVOD_FUSION_THRESHOLD=%lld", bytes);
        if (!rc)
            rc = env_add(&env, &k, "KOLO_FUSION_THRESHOLD=%lld", bytes);
    }
    if (!rc && from_user(tab, n, "cycle-time-ms"))
        rc = env_add(&env, &k, "HOROVOD_CYCLE_TIME=%s", o->cycle_time_ms);
    if (!rc && from_user(tab, n, "cache-capacity"))
        rc = env_add(&env, &k, "HOROVOD_CACHE_CAPACITY=%lld", (long long)o->cache_capacity);
    if (!rc && from_user(tab, n, "stall-check"))
        rc = env_add(&env, &k, "HOROVOD_STALL_CHECK_DISABLE=%d", o->stall_check ? 0 : 1);
    if (!rc && from_user(tab, n, "stall-check-warning-time-seconds"))
        rc = env_add(&env, &k, "HOROVOD_STALL_CHECK_TIME_SECONDS=%lld",
                     (long long)o->stall_warning_s);
    if (!rc && from_user(tab, n, "stall-check-shutdown-time-seconds"))
        rc = env_add(&env, &k, "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=%lld",
                     (long long)o->stall_shutdown_s);
    if (!rc && from_user(tab, n, "encrypt-data"))
        rc = env_add(&env, &k, "KOLO_DATA_ENCRYPT=%d", o->encrypt_data ? 1 : 0);
    if (!rc && from_user(tab, n, "timeline-filename"))
        rc = env_add(&env, &k, "HOROVOD_TIMELINE=%s", o->timeline_filename);
    if (!rc && from_user(tab, n, "log-level")) {
        rc = env_add(&env, &k, "HOROVOD_LOG_LEVEL=%s", horovod_level(o->log_level));
        if (!rc)
            rc = env_add(&env, &k, "KOLO_LOG_LEVEL=%s",
                         log_level_name(log_parse_level(o->log_level)));
    }
    if (rc) {
        run_job_env_free(env);
        return NULL;
    }
    return env;
}

void run_job_env_free(char **env)
{
    for (size_t i = 0; env && env[i]; i++)
        free(env[i]);
    free(env);
}

/* ------------------------------------------------------------ --check-build */

/* NCCL counts when the GPU backend is compiled in: cli/CMakeLists.txt
 * defines KOLO_BUILT_NCCL where CMake found the CUDA and NCCL headers
 * (libkolo loads the libraries themselves at run time, docs/gpu.md). */
#ifndef KOLO_BUILT_NCCL
#define KOLO_BUILT_NCCL 0
#endif

void run_print_check_build(FILE *out)
{
    const char *nccl = KOLO_BUILT_NCCL ? "X" : " ";
    fprintf(out,
            "kolo v%s:\n"
            "\n"
            "Available Frameworks:\n"
            "    [ ] TensorFlow\n"
            "    [X] PyTorch (python/kolo: kolo.torch)\n"
            "    [ ] MXNet\n"
            "\n"
            "Available Controllers:\n"
            "    [ ] MPI\n"
            "    [ ] Gloo\n"
            "    [X] kolo coordinator\n"
            "\n"
            "Available Tensor Operations:\n"
            "    [%s] NCCL\n"
            "    [ ] DDL\n"
            "    [ ] CCL\n"
            "    [ ] MPI\n"
            "    [ ] Gloo\n"
            "    [X] TCP ring (between hosts)\n"
            "    [X] shared memory (within a host)\n",
            KOLO_VERSION, nccl);
}
