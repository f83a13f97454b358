/*
 * job_user.c - running jobs as a user of their own (`kolo agent
 * --job-user USER`).
 *
 * DESIGN. The agent's files (its state directory, the cluster token it
 * read) must stay out of a job's reach, so a packaged agent runs its
 * workers as a separate user (kolo-job) that can read neither. The switch
 * happens in the exec shim (`kolo __exec --user USER -- argv`), first
 * thing, before it asks for its parent-death signal (a change of
 * credentials clears that) and before it forks the command: the shim and
 * everything under it run as USER, with USER's groups (initgroups, so a
 * kolo-job added to video/render reaches the GPUs), and no capability
 * left: an agent that runs as an ordinary user holding CAP_SETUID and
 * CAP_SETGID (systemd's AmbientCapabilities) would otherwise hand those
 * to its jobs, because a change between two non-root uids keeps them.
 *
 * What the job keeps from before the switch: its output pipes (made by the
 * agent, inherited), its working directory (entered by the agent's child
 * before exec; the job needs rights on it and below only), its environment
 * (the job credential included: it is the job's own). Shared-memory
 * segments are made by the ranks themselves, so every rank of a host owns
 * its segments as the same USER.
 *
 * The agent checks at start that it can switch (root, or CAP_SETUID,
 * CAP_SETGID and CAP_KILL, the last to signal the workers' process
 * groups), so a misconfigured agent fails at start, not at every job.
 */
#include <errno.h>
#include <grp.h>
#include <linux/capability.h>
#include <pwd.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "agent_int.h"

/* The effective capability set (both 32-bit words), or 0 where capget
 * fails. */
static uint64_t effective_caps(void)
{
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof data);
    if (syscall(SYS_capget, &hdr, data) != 0)
        return 0;
    return (uint64_t)data[0].effective | (uint64_t)data[1].effective << 32;
}

static bool has_cap(uint64_t set, int cap)
{
    return (set >> cap) & 1;
}

/* lookup finds name's uid and gid, refusing root. */
static int lookup(const char *name, uid_t *uid, gid_t *gid, char *err, size_t errlen)
{
    errno = 0;
    struct passwd *pw = getpwnam(name);
    if (!pw) {
        snprintf(err, errlen, "job user '%s': %s", name, errno ? strerror(errno) : "no such user");
        return -1;
    }
    *uid = pw->pw_uid;
    *gid = pw->pw_gid;
    if (pw->pw_uid == 0) {
        snprintf(err, errlen, "job user '%s' is root: name an unprivileged user", name);
        return -1;
    }
    return 0;
}

int job_user_resolve(const char *name, uid_t *uid, gid_t *gid, char *err, size_t errlen)
{
    if (lookup(name, uid, gid, err, errlen) != 0)
        return -1;
    if (*uid == geteuid())
        return 0; /* jobs run as the agent's own user: nothing to switch */
    uint64_t caps = effective_caps();
    if (geteuid() != 0 &&
        !(has_cap(caps, CAP_SETUID) && has_cap(caps, CAP_SETGID) && has_cap(caps, CAP_KILL))) {
        snprintf(err, errlen,
                 "cannot run jobs as '%s': the agent runs as uid %d without CAP_SETUID, "
                 "CAP_SETGID and CAP_KILL (run it as root, or give it those capabilities)",
                 name, (int)geteuid());
        return -1;
    }
    return 0;
}

int job_user_become(const char *name, char *err, size_t errlen)
{
    uid_t uid;
    gid_t gid;
    if (lookup(name, &uid, &gid, err, errlen) != 0)
        return -1;
    if (getuid() != uid || geteuid() != uid) {
        if (initgroups(name, gid) != 0 || setresgid(gid, gid, gid) != 0 ||
            setresuid(uid, uid, uid) != 0) {
            snprintf(err, errlen, "cannot become job user '%s': %s", name, strerror(errno));
            return -1;
        }
    }
    /* Whatever capabilities survived the change (ambient ones of a
     * non-root agent) go; none may reach the command. */
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct none[2];
    memset(none, 0, sizeof none);
    if (syscall(SYS_capset, &hdr, none) != 0) {
        snprintf(err, errlen, "cannot drop capabilities: %s", strerror(errno));
        return -1;
    }
    if (setuid(0) == 0 || effective_caps() != 0) {
        snprintf(err, errlen, "dropping privileges to '%s' did not hold", name);
        return -1;
    }
    return 0;
}
