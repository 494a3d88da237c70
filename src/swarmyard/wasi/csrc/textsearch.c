/*
 * textsearch: every line holding a literal pattern, in a file or a folder (walked in name order) under /data.
 * Arguments: pattern, path (default "."), ignore_case (true/false), max_matches (default 100).
 * Result: {"matches": [{"path", "line", "text"}], "files": N, "truncated": bool}; a line is cut at 400 bytes, back
 * to the start of the UTF-8 character there (never half a character) and, where a space is within the last 100
 * bytes, to the end of the word before it (a quote of a cut line must not end inside a word).
 */
#include <ctype.h>
#include <dirent.h>
#include <sys/stat.h>

#include "tool.h"

static const char *pattern;
static size_t pattern_len;
static int ignore_case;
static long max_matches, found, files;
static int first = 1;

static int match_at(const char *s, size_t left) {
    if (left < pattern_len) return 0;
    if (!ignore_case) return memcmp(s, pattern, pattern_len) == 0;
    for (size_t i = 0; i < pattern_len; i++)
        if (tolower((unsigned char)s[i]) != tolower((unsigned char)pattern[i])) return 0;
    return 1;
}

static void search_file(const char *rel) {
    size_t len;
    char *text = read_file(rel, &len);
    files++;
    long line = 1;
    const char *start = text, *end = text + len;
    while (start < end && found < max_matches) {
        const char *nl = memchr(start, '\n', (size_t)(end - start));
        const char *stop = nl ? nl : end;
        for (const char *p = start; p < stop; p++) {
            if (match_at(p, (size_t)(stop - p))) {
                if (!first) putchar(',');
                first = 0;
                fputs("{\"path\":", stdout);
                put_json_cstr(rel);
                printf(",\"line\":%ld,\"text\":", line);
                size_t n = (size_t)(stop - start), cut = n > 400 ? 400 : n;
                while (cut < n && cut > 0 && ((unsigned char)start[cut] & 0xC0) == 0x80) cut--;
                if (cut < n) {  /* and back to the end of a word: a quote of it must not end inside one */
                    size_t at = cut;
                    while (at > 300 && start[at] != ' ') at--;
                    if (start[at] == ' ') {
                        while (at > 0 && start[at - 1] == ' ') at--;
                        cut = at;
                    }
                }
                put_json_string(start, cut);
                putchar('}');
                found++;
                break;
            }
        }
        line++;
        start = stop + 1;
    }
    free(text);
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void walk(const char *rel) {
    char *path = data_path(rel);
    struct stat st;
    if (stat(path, &st) != 0) fail(strerror(errno), rel);
    if (!S_ISDIR(st.st_mode)) {
        free(path);
        search_file(rel);
        return;
    }
    DIR *dir = opendir(path);
    if (!dir) fail(strerror(errno), rel);
    size_t n = 0, cap = 16;
    char **names = xmalloc(cap * sizeof *names);
    for (struct dirent *e; (e = readdir(dir));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        if (n == cap) names = xrealloc(names, (cap *= 2) * sizeof *names);
        names[n++] = strdup(e->d_name);
    }
    closedir(dir);
    free(path);
    qsort(names, n, sizeof *names, by_name);
    for (size_t i = 0; i < n && found < max_matches; i++) {
        size_t size = strlen(rel) + strlen(names[i]) + 2;
        char *child = xmalloc(size);
        if (strcmp(rel, ".") == 0) snprintf(child, size, "%s", names[i]);
        else snprintf(child, size, "%s/%s", rel, names[i]);
        walk(child);
        free(child);
        free(names[i]);
    }
    free(names);
}

int main(int argc, char **argv) {
    pattern = need_arg(argc, argv, "pattern");
    pattern_len = strlen(pattern);
    if (pattern_len == 0) fail("the pattern is empty", NULL);
    ignore_case = strcmp(arg(argc, argv, "ignore_case", "false"), "true") == 0;
    max_matches = int_arg(argc, argv, "max_matches", 100);
    if (max_matches < 1 || max_matches > 10000) fail("max_matches must be 1..10000", NULL);
    fputs("{\"matches\":[", stdout);
    walk(arg(argc, argv, "path", "."));
    printf("],\"files\":%ld,\"truncated\":%s}\n", files, found >= max_matches ? "true" : "false");
    return 0;
}
