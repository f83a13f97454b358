/*
 * tls.h - optional TLS for the RPC port (nng's tls+tcp:// transport) and
 * the HTTP port (https://), from three PEM files.
 *
 * One CA signs every certificate of a cluster. Each component is given
 * the same three settings (flags --tls-cert/--tls-key/--tls-ca, or
 * --tls-dir holding cert.pem, key.pem and ca.pem; the environment's
 * KOLO_TLS_CERT/KEY/CA/DIR the same way):
 *   - the coordinator presents cert/key on both ports; on the RPC port it
 *     requires a client certificate signed by the CA (mutual TLS), on the
 *     HTTP port it does not (browsers and curl have none);
 *   - agents, workers and the CLI verify the coordinator's certificate
 *     against the CA and its name against the host in the URL, and
 *     present their own cert/key.
 * TLS protects the channel; the cluster token still authenticates every
 * RPC frame (common/rpc.h), so a leaked client certificate alone submits
 * nothing.
 */
#ifndef KOLO_COMMON_TLS_H
#define KOLO_COMMON_TLS_H

#include <stdbool.h>
#include <stddef.h>

#include <nng/nng.h>
#include <nng/supplemental/tls/tls.h>

#define TLS_PATH_MAX 1024

/* Absolute paths of the PEM files; all empty = TLS off. */
struct tls_files {
    char cert[TLS_PATH_MAX];
    char key[TLS_PATH_MAX];
    char ca[TLS_PATH_MAX];
};

/*
 * tls_files_init fills f from the given paths (any may be NULL or "") and
 * dir (cert.pem, key.pem, ca.pem inside it, for whichever path is not
 * given). Paths become absolute, so they can be handed to child processes.
 * TLS is on when anything was given; then ca is required, cert and key
 * come together, the files must be readable, and the key may not be
 * readable by group or others. 0, or KOLO_EINVAL with a message.
 */
int tls_files_init(struct tls_files *f, const char *cert, const char *key, const char *ca,
                   const char *dir, char *err, size_t errlen);
/* The same from KOLO_TLS_CERT, KOLO_TLS_KEY, KOLO_TLS_CA and KOLO_TLS_DIR. */
int tls_files_from_env(struct tls_files *f, char *err, size_t errlen);
/* True when f asks for TLS (f may be NULL). */
bool tls_files_on(const struct tls_files *f);

/* The four knobs (knobs.h) of every command that serves or reaches a
 * coordinator, into char * variables; the environment's KOLO_TLS_CERT,
 * KOLO_TLS_KEY, KOLO_TLS_CA and KOLO_TLS_DIR set them too. */
#define TLS_KNOBS(cert, key, ca, dir)                                                              \
    {"tls-cert", NULL, NULL, KNOB_STR, NULL, 1, 0,                                                 \
     "PEM certificate this process presents; TLS on the RPC and HTTP ports (docs/security.md)",   \
     &(cert)},                                                                                     \
        {"tls-key", NULL, NULL, KNOB_STR, NULL, 1, 0,                                              \
         "PEM private key of --tls-cert (mode 0600)", &(key)},                                     \
        {"tls-ca", NULL, NULL, KNOB_STR, NULL, 1, 0,                                               \
         "PEM certificate of the CA that signed the cluster's certificates", &(ca)},               \
        {"tls-dir", NULL, NULL, KNOB_STR, NULL, 1, 0,                                              \
         "directory holding cert.pem, key.pem and ca.pem (scripts/tls-certs.sh makes one)", &(dir)}

enum tls_role {
    TLS_RPC_SERVER,  /* cert/key, and client certificates required */
    TLS_HTTP_SERVER, /* cert/key, no client certificate asked for */
    TLS_CLIENT,      /* verifies the server against ca and server_name */
};

/* tls_config_new builds nng's TLS configuration for role; server_name is
 * the host the client dialed (clients only). The caller frees it with
 * nng_tls_config_free once a listener, dialer or server holds it. */
int tls_config_new(nng_tls_config **out, enum tls_role role, const struct tls_files *f,
                   const char *server_name, char *err, size_t errlen);

/*
 * tls_url writes url with the scheme TLS asks for: with tls on, tcp://
 * becomes tls+tcp:// and http:// becomes https://; with it off the URL is
 * copied. A tls+tcp:// or https:// URL without TLS files is an error
 * (KOLO_EINVAL, "... needs --tls-ca"), as is a scheme TLS cannot carry.
 */
int tls_url(char *out, size_t outlen, const char *url, const struct tls_files *f, char *err,
            size_t errlen);
/* The host part of a tcp://, tls+tcp://, http:// or https:// URL. */
int tls_url_host(const char *url, char *host, size_t hostlen);

#endif
