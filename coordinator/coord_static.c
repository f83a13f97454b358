#include "coord_static.h"

#include <string.h>

const struct static_file *static_file_find(const char *path)
{
    if (strcmp(path, "/") == 0)
        path = "/index.html";
    for (const struct static_file *f = dashboard_files; f->path; f++)
        if (strcmp(f->path, path) == 0)
            return f;
    return NULL;
}

const char *static_content_type(const char *path)
{
    static const struct {
        const char *ext, *type;
    } types[] = {
        {".html", "text/html; charset=utf-8"}, {".js", "text/javascript; charset=utf-8"},
        {".css", "text/css; charset=utf-8"},   {".json", "application/json"},
        {".svg", "image/svg+xml"},             {".png", "image/png"},
    };
    const char *dot = strrchr(path, '.');
    for (size_t i = 0; dot && i < sizeof(types) / sizeof(types[0]); i++)
        if (strcmp(dot, types[i].ext) == 0)
            return types[i].type;
    return "application/octet-stream";
}
