/*
 * log.h - leveled logging to stderr (or a sink of the caller's choice).
 *
 * The level comes from KOLO_LOG_LEVEL (trace, debug, info, warn, error,
 * off). A library (libkolo) stays silent unless the variable says
 * otherwise; a daemon calls log_set_default() with its own default before
 * the first message. Python installs a sink to route lines to `logging`.
 * Thread-safe: one line is one write.
 */
#ifndef KOLO_COMMON_LOG_H
#define KOLO_COMMON_LOG_H

#include <stdarg.h>

enum log_level { LOG_TRACE = 0, LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR, LOG_OFF };

typedef void (*log_sink_fn)(int level, const char *module, const char *msg, void *arg);

/* log_set_default sets the level used when KOLO_LOG_LEVEL is unset. */
void log_set_default(int level);
/* log_set_level overrides both the default and KOLO_LOG_LEVEL. */
void log_set_level(int level);
int log_get_level(void);
/* log_parse_level maps "info" (any case) or "2" to a level; -1 if unknown. */
int log_parse_level(const char *s);
const char *log_level_name(int level);
/* log_set_sink routes messages to fn instead of stderr; NULL restores stderr. */
void log_set_sink(log_sink_fn fn, void *arg);

void log_msg(int level, const char *module, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void log_vmsg(int level, const char *module, const char *fmt, va_list ap);

#define log_enabled(lvl) ((lvl) >= log_get_level())
#define LOGT(mod, ...)                                                                             \
    do {                                                                                           \
        if (log_enabled(LOG_TRACE))                                                                \
            log_msg(LOG_TRACE, mod, __VA_ARGS__);                                                  \
    } while (0)
#define LOGD(mod, ...)                                                                             \
    do {                                                                                           \
        if (log_enabled(LOG_DEBUG))                                                                \
            log_msg(LOG_DEBUG, mod, __VA_ARGS__);                                                  \
    } while (0)
#define LOGI(mod, ...)                                                                             \
    do {                                                                                           \
        if (log_enabled(LOG_INFO))                                                                 \
            log_msg(LOG_INFO, mod, __VA_ARGS__);                                                   \
    } while (0)
#define LOGW(mod, ...)                                                                             \
    do {                                                                                           \
        if (log_enabled(LOG_WARN))                                                                 \
            log_msg(LOG_WARN, mod, __VA_ARGS__);                                                   \
    } while (0)
#define LOGE(mod, ...)                                                                             \
    do {                                                                                           \
        if (log_enabled(LOG_ERROR))                                                                \
            log_msg(LOG_ERROR, mod, __VA_ARGS__);                                                  \
    } while (0)

#endif
