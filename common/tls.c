/*
 * tls.c - TLS settings from PEM files, turned into nng's configuration.
 */
#include "tls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errors.h"
#include "util.h"

#define PEM_MAX (1u << 20)

/* One file: the given path, else dir/name, made absolute and checked. */
static int pick(char *dst, const char *given, const char *dir, const char *name, const char *what,
                bool secret, char *err, size_t errlen)
{
    char path[TLS_PATH_MAX];
    dst[0] = '\0';
    if (given && *given)
        str_copy(path, given, sizeof path);
    else if (dir && *dir)
        snprintf(path, sizeof path, "%s/%s", dir, name);
    else
        return 0;
    char abs[PATH_MAX];
    if (!realpath(path, abs))
        return errf(err, errlen, KOLO_EINVAL, "TLS %s %s: %s", what, path, strerror(errno));
    struct stat st;
    if (stat(abs, &st) != 0 || !S_ISREG(st.st_mode) || access(abs, R_OK) != 0)
        return errf(err, errlen, KOLO_EINVAL, "TLS %s %s is not a readable file", what, path);
    /* A private key others can read is a leaked key. */
    if (secret && (st.st_mode & (S_IRGRP | S_IROTH | S_IWGRP | S_IWOTH)))
        return errf(err, errlen, KOLO_EINVAL,
                    "TLS key %s is accessible by group or others (mode %04o); run: chmod 600 %s",
                    path, (unsigned)(st.st_mode & 07777), path);
    if (strlen(abs) >= TLS_PATH_MAX)
        return errf(err, errlen, KOLO_EINVAL, "TLS %s path %s is too long", what, abs);
    str_copy(dst, abs, TLS_PATH_MAX);
    return 0;
}

int tls_files_init(struct tls_files *f, const char *cert, const char *key, const char *ca,
                   const char *dir, char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    int rv;
    if ((rv = pick(f->cert, cert, dir, "cert.pem", "certificate", false, err, errlen)) != 0 ||
        (rv = pick(f->key, key, dir, "key.pem", "key", true, err, errlen)) != 0 ||
        (rv = pick(f->ca, ca, dir, "ca.pem", "CA", false, err, errlen)) != 0) {
        memset(f, 0, sizeof *f);
        return rv;
    }
    if (!f->cert[0] && !f->key[0] && !f->ca[0])
        return 0;
    if (!f->ca[0])
        rv = errf(err, errlen, KOLO_EINVAL,
                  "TLS needs the CA that signed the cluster's certificates (--tls-ca)");
    else if (!f->cert[0] != !f->key[0])
        rv = errf(err, errlen, KOLO_EINVAL, "TLS needs --tls-cert and --tls-key together");
    if (rv)
        memset(f, 0, sizeof *f);
    return rv;
}

int tls_files_from_env(struct tls_files *f, char *err, size_t errlen)
{
    return tls_files_init(f, getenv("KOLO_TLS_CERT"), getenv("KOLO_TLS_KEY"),
                          getenv("KOLO_TLS_CA"), getenv("KOLO_TLS_DIR"), err, errlen);
}

bool tls_files_on(const struct tls_files *f)
{
    return f && f->ca[0];
}

static int nng_fail(char *err, size_t errlen, int rv, const char *what, const char *path)
{
    return errf(err, errlen, KOLO_EINVAL, "TLS: cannot use %s %s: %s", what, path,
                nng_strerror(rv));
}

static bool is_ip(const char *host)
{
    unsigned char buf[sizeof(struct in6_addr)];
    return inet_pton(AF_INET, host, buf) == 1 || inet_pton(AF_INET6, host, buf) == 1;
}

int tls_config_new(nng_tls_config **out, enum tls_role role, const struct tls_files *f,
                   const char *server_name, char *err, size_t errlen)
{
    *out = NULL;
    bool server = role != TLS_CLIENT;
    if (server && !f->cert[0])
        return errf(err, errlen, KOLO_EINVAL,
                    "TLS: a server needs its certificate and key (--tls-cert, --tls-key)");
    nng_tls_config *cfg;
    int rv = nng_tls_config_alloc(&cfg, server ? NNG_TLS_MODE_SERVER : NNG_TLS_MODE_CLIENT);
    if (rv != 0)
        return errf(err, errlen, rv == NNG_ENOTSUP ? KOLO_EINVAL : KOLO_ENOMEM,
                    "TLS is not available in this libnng: %s", nng_strerror(rv));
    int code = 0;
    char *cert = NULL, *key = NULL;
    size_t len;
    if (f->cert[0]) {
        if (read_file_all(f->cert, &cert, &len, PEM_MAX) != 0 ||
            read_file_all(f->key, &key, &len, PEM_MAX) != 0) {
            code = errf(err, errlen, KOLO_EINVAL, "TLS: cannot read %s or %s", f->cert, f->key);
            goto out;
        }
        if ((rv = nng_tls_config_own_cert(cfg, cert, key, NULL)) != 0) {
            code = nng_fail(err, errlen, rv, "certificate and key", f->cert);
            goto out;
        }
    }
    /* The CA verifies the other side; HTTPS clients (browsers) bring no
     * certificate, so the HTTP server neither loads nor asks for one. */
    if (role != TLS_HTTP_SERVER && (rv = nng_tls_config_ca_file(cfg, f->ca)) != 0) {
        code = nng_fail(err, errlen, rv, "CA", f->ca);
        goto out;
    }
    rv = nng_tls_config_auth_mode(cfg, role == TLS_HTTP_SERVER ? NNG_TLS_AUTH_MODE_NONE
                                                               : NNG_TLS_AUTH_MODE_REQUIRED);
    /* Debian's mbedTLS (2.28) matches names, never IP addresses, against
     * a certificate: a client that dials an address verifies the chain
     * only (docs/security.md). */
    if (rv == 0 && role == TLS_CLIENT && server_name && *server_name && !is_ip(server_name))
        rv = nng_tls_config_server_name(cfg, server_name);
    if (rv == 0)
        rv = nng_tls_config_version(cfg, NNG_TLS_1_2, NNG_TLS_1_3);
    if (rv != 0)
        code = errf(err, errlen, KOLO_EINVAL, "TLS: %s", nng_strerror(rv));
out:
    if (key) {
        memset(key, 0, strlen(key));
        free(key);
    }
    free(cert);
    if (code)
        nng_tls_config_free(cfg);
    else
        *out = cfg;
    return code;
}

static const struct {
    const char *plain, *secure;
} schemes[] = {{"tcp://", "tls+tcp://"}, {"http://", "https://"}};

int tls_url(char *out, size_t outlen, const char *url, const struct tls_files *f, char *err,
            size_t errlen)
{
    bool on = tls_files_on(f);
    for (size_t i = 0; i < sizeof schemes / sizeof schemes[0]; i++) {
        size_t pl = strlen(schemes[i].plain), sl = strlen(schemes[i].secure);
        bool secure = strncmp(url, schemes[i].secure, sl) == 0;
        if (!secure && strncmp(url, schemes[i].plain, pl) != 0)
            continue;
        const char *rest = url + (secure ? sl : pl);
        if (secure && !on)
            return errf(err, errlen, KOLO_EINVAL,
                        "%s is a TLS address and needs --tls-ca (or KOLO_TLS_CA)", url);
        if ((size_t)snprintf(out, outlen, "%s%s", on ? schemes[i].secure : schemes[i].plain,
                             rest) >= outlen)
            return errf(err, errlen, KOLO_EINVAL, "address %s is too long", url);
        return 0;
    }
    if (on)
        return errf(err, errlen, KOLO_EINVAL, "TLS cannot carry %s (a tcp:// address is)", url);
    if ((size_t)snprintf(out, outlen, "%s", url) >= outlen)
        return errf(err, errlen, KOLO_EINVAL, "address %s is too long", url);
    return 0;
}

int tls_url_host(const char *url, char *host, size_t hostlen)
{
    const char *p = strstr(url, "://");
    if (!p || hostlen == 0)
        return KOLO_EINVAL;
    p += 3;
    const char *end;
    if (*p == '[') { /* [v6]:port */
        p++;
        end = strchr(p, ']');
    } else {
        end = strrchr(p, ':');
        const char *slash = strchr(p, '/');
        if (!end || (slash && slash < end))
            end = slash ? slash : p + strlen(p);
    }
    if (!end || (size_t)(end - p) >= hostlen)
        return KOLO_EINVAL;
    memcpy(host, p, (size_t)(end - p));
    host[end - p] = '\0';
    return 0;
}
