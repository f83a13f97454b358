/* The dashboard's static files, compiled into the coordinator
 * (dashboard/embed.cmake writes the table at build time). */
#ifndef KOLO_COORD_STATIC_H
#define KOLO_COORD_STATIC_H

#include <stddef.h>

struct static_file {
    const char *path; /* "/index.html" */
    const unsigned char *data;
    size_t len;
};

/* Ends with an entry whose path is NULL. */
extern const struct static_file dashboard_files[];

/* The embedded file served at `path`, "/" meaning "/index.html"; NULL if none. */
const struct static_file *static_file_find(const char *path);

/* Content-Type for a file name, by its extension. */
const char *static_content_type(const char *path);

#endif
