/*
 * job_lines.c - a job's output lines as `kolo run`, `kolo attach` and
 * `kolo logs` print them.
 *
 * DESIGN. A job's output is whatever its processes wrote, so it may hold
 * terminal escape sequences: colours, but also ones that set the window
 * title, rewrite what is already on the screen, or (on some terminals)
 * answer back into the operator's shell. When the stream is a terminal,
 * every control byte is therefore printed as a visible escape: C0 (but
 * tab), DEL, and C1 in UTF-8 (U+0080..U+009F, \xc2\x80..\xc2\x9f), each
 * byte as \xNN, as are bytes that are not valid UTF-8 (a lone \x9b is CSI
 * to a terminal in 8-bit mode). Valid UTF-8 text stays as it is, and so
 * do backslashes: the escapes are for a person, not a reversible
 * encoding. When the stream is not a terminal (a pipe, a file), the
 * bytes pass through untouched, so what is saved is exactly what the job
 * wrote; --raw keeps them untouched on a terminal too.
 */
#include "cli.h"
#include "json.h"

#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

bool cli_escape_wanted(FILE *f, bool raw)
{
    return !raw && isatty(fileno(f));
}

void cli_write_text(FILE *f, const void *text, size_t len, bool escape)
{
    const uint8_t *p = text;
    if (!escape) {
        fwrite(p, 1, len, f);
        return;
    }
    size_t i = 0, run = 0; /* p[run..i) is text to copy as it is */
    while (i < len) {
        uint8_t b = p[i];
        size_t n = 1;
        bool visible;
        if (b < 0x80) {
            visible = b == '\t' || (b >= 0x20 && b != 0x7f);
        } else {
            unsigned cp = 0;
            n = utf8_decode(p + i, len - i, &cp);
            visible = n > 0 && !(cp >= 0x80 && cp <= 0x9f);
            if (!n)
                n = 1;
        }
        if (!visible) {
            fwrite(p + run, 1, i - run, f);
            for (size_t k = 0; k < n; k++)
                fprintf(f, "\\x%02x", p[i + k]);
            run = i + n;
        }
        i += n;
    }
    fwrite(p + run, 1, len - run, f);
}

void cli_print_job_line(FILE *f, int rank, bool err_stream, bool prefix, const void *text,
                        size_t len, bool escape)
{
    if (prefix)
        fprintf(f, "[%d]<%s>:", rank, err_stream ? "stderr" : "stdout");
    cli_write_text(f, text, len, escape);
    fputc('\n', f);
}
