/*
 * inventory.c - what this host offers: CPUs, GPUs, memory, an address.
 *
 * GPUs are counted through the CUDA runtime loaded with dlopen, so one
 * agent binary runs on hosts with and without CUDA. cudaGetDeviceCount
 * initialises the driver but creates no context and takes no GPU memory.
 * The library stays loaded: the CUDA runtime registers exit handlers, and
 * unloading it under them is a known way to crash at exit. Names come
 * from the driver API (cuDeviceGetName), whose signature, unlike the
 * runtime's cudaDeviceProp, does not change between CUDA versions.
 *
 * The GPU count is the agent's default number of slots: one worker per
 * GPU. CUDA_VISIBLE_DEVICES in the agent's environment limits what it
 * counts and is inherited by the workers unchanged; each worker selects
 * its GPU by its local rank (docs/gpu.md), as under Horovod.
 */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent_int.h"
#include "log.h"
#include "util.h"

static void *dlopen_first(const char *const *names)
{
    for (size_t i = 0; names[i]; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h)
            return h;
    }
    return NULL;
}

static int count_gpus(void)
{
    static const char *const cudart[] = {"libcudart.so", "libcudart.so.13", "libcudart.so.12",
                                         "libcudart.so.11.0", NULL};
    typedef int (*get_count_fn)(int *);
    void *h = dlopen_first(cudart);
    if (!h) {
        LOGD("agent", "CUDA runtime not loadable, counting no GPUs");
        return 0;
    }
    get_count_fn get_count = (get_count_fn)dlsym(h, "cudaGetDeviceCount");
    int n = 0;
    if (!get_count || get_count(&n) != 0 || n < 0)
        n = 0;
    return n;
}

static void gpu_names(struct inventory *inv)
{
    static const char *const cuda[] = {"libcuda.so.1", "libcuda.so", NULL};
    typedef int (*init_fn)(unsigned);
    typedef int (*get_fn)(int *, int);
    typedef int (*name_fn)(char *, int, int);
    void *h = dlopen_first(cuda);
    if (!h)
        return;
    init_fn cu_init = (init_fn)dlsym(h, "cuInit");
    get_fn cu_get = (get_fn)dlsym(h, "cuDeviceGet");
    name_fn cu_name = (name_fn)dlsym(h, "cuDeviceGetName");
    if (!cu_init || !cu_get || !cu_name || cu_init(0) != 0)
        return;
    inv->gpu_names = calloc((size_t)inv->gpus, sizeof(char *));
    if (!inv->gpu_names)
        return;
    for (int i = 0; i < inv->gpus; i++) {
        int dev;
        char name[256];
        if (cu_get(&dev, i) != 0 || cu_name(name, (int)sizeof(name), dev) != 0)
            break;
        name[sizeof(name) - 1] = '\0';
        if (!(inv->gpu_names[i] = strdup(name)))
            break;
        inv->n_gpu_names++;
    }
}

void inventory_probe(struct inventory *inv)
{
    memset(inv, 0, sizeof(*inv));
    inv->cpus = usable_cpus();
    inv->gpus = count_gpus();
    if (inv->gpus > 0)
        gpu_names(inv);
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    if (pages > 0 && page > 0)
        inv->mem_bytes = (uint64_t)pages * (uint64_t)page;
}

void inventory_free(struct inventory *inv)
{
    for (size_t i = 0; i < inv->n_gpu_names; i++)
        free(inv->gpu_names[i]);
    free(inv->gpu_names);
    inv->gpu_names = NULL;
    inv->n_gpu_names = 0;
}

static bool ipv4_usable(const struct in_addr *in)
{
    uint32_t a = ntohl(in->s_addr);
    return (a >> 24) != 127 && a != 0;
}

void host_default_addr(const char *hostname, char *out, size_t n)
{
    /* First what the host name resolves to, which is what an operator
     * usually means by "this host's address"; then any interface that is
     * up. Both skip loopback: other hosts cannot reach 127.x. */
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    if (hostname && *hostname && getaddrinfo(hostname, NULL, &hints, &res) == 0) {
        for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
            struct sockaddr_in *sin = (struct sockaddr_in *)ai->ai_addr;
            if (ai->ai_family == AF_INET && ipv4_usable(&sin->sin_addr) &&
                inet_ntop(AF_INET, &sin->sin_addr, out, (socklen_t)n)) {
                freeaddrinfo(res);
                return;
            }
        }
        freeaddrinfo(res);
    }
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) == 0) {
        for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
            if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) ||
                (i->ifa_flags & IFF_LOOPBACK))
                continue;
            struct sockaddr_in *sin = (struct sockaddr_in *)i->ifa_addr;
            if (ipv4_usable(&sin->sin_addr) &&
                inet_ntop(AF_INET, &sin->sin_addr, out, (socklen_t)n)) {
                freeifaddrs(ifs);
                return;
            }
        }
        freeifaddrs(ifs);
    }
    str_copy(out, "127.0.0.1", n);
}
