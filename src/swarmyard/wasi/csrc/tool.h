/*
 * What every shipped WASI tool shares: its arguments, its JSON output, and the exit codes the host reads.
 *
 * The host (swarmyard.wasi.runner) passes the typed JSON arguments it validated as argv entries "name=value",
 * preopens one folder as /data, and reads one JSON object from stdout. Exit codes: 0 a result on stdout;
 * 2 bad arguments or an unreadable input (the message on stderr); 3 out of memory (the host's memory cap).
 */
#ifndef SWARMYARD_TOOL_H
#define SWARMYARD_TOOL_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXIT_BAD_INPUT 2
#define EXIT_NO_MEMORY 3

static void fail(const char *what, const char *detail) {
    fprintf(stderr, "%s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    exit(EXIT_BAD_INPUT);
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fputs("out of memory\n", stderr);
        exit(EXIT_NO_MEMORY);
    }
    return p;
}

static void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) {
        fputs("out of memory\n", stderr);
        exit(EXIT_NO_MEMORY);
    }
    return q;
}

/* The value of argument NAME ("NAME=value" in argv), or FALLBACK. */
static const char *arg(int argc, char **argv, const char *name, const char *fallback) {
    size_t n = strlen(name);
    for (int i = 1; i < argc; i++)
        if (strncmp(argv[i], name, n) == 0 && argv[i][n] == '=') return argv[i] + n + 1;
    return fallback;
}

static const char *need_arg(int argc, char **argv, const char *name) {
    const char *value = arg(argc, argv, name, NULL);
    if (!value) fail("missing argument", name);
    return value;
}

static long int_arg(int argc, char **argv, const char *name, long fallback) {
    const char *value = arg(argc, argv, name, NULL);
    if (!value) return fallback;
    char *end;
    long n = strtol(value, &end, 10);
    if (*value == 0 || *end != 0) fail("not an integer", name);
    return n;
}

/* A path under the preopened folder: relative, no "..", as the guest sees it (/data/...). */
static char *data_path(const char *rel) {
    if (rel[0] == '/') fail("paths are relative to the tool's folder", rel);
    for (const char *p = rel; *p; p++)
        if (p[0] == '.' && p[1] == '.' && (p == rel || p[-1] == '/') && (p[2] == 0 || p[2] == '/'))
            fail("a path may not leave the tool's folder", rel);
    size_t n = strlen(rel);
    char *out = xmalloc(n + 7);
    memcpy(out, "/data/", 6);
    memcpy(out + 6, rel, n + 1);
    return out;
}

/* A whole file's bytes, NUL-terminated; *len gets the length. */
static char *read_file(const char *rel, size_t *len) {
    char *path = data_path(rel);
    FILE *f = fopen(path, "rb");
    if (!f) fail(strerror(errno), rel);
    size_t cap = 65536, n = 0;
    char *buf = xmalloc(cap);
    for (;;) {
        if (n + 1 >= cap) buf = xrealloc(buf, cap *= 2);
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        if (got == 0) break;
        n += got;
    }
    if (ferror(f)) fail("cannot read", rel);
    fclose(f);
    free(path);
    buf[n] = 0;
    *len = n;
    return buf;
}

/* A JSON string literal of LEN bytes of S (control characters escaped; bytes >= 0x80 pass as they are). */
static void put_json_string(const char *s, size_t len) {
    putchar('"');
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            putchar('\\');
            putchar(c);
        } else if (c == '\n') {
            fputs("\\n", stdout);
        } else if (c == '\t') {
            fputs("\\t", stdout);
        } else if (c == '\r') {
            fputs("\\r", stdout);
        } else if (c < 0x20 || c == 0x7f) {
            printf("\\u%04x", c);
        } else {
            putchar(c);
        }
    }
    putchar('"');
}

static void put_json_cstr(const char *s) { put_json_string(s, strlen(s)); }

#endif
