/*
 * csvdiff: two CSV files (RFC 4180: quoted fields, doubled quotes, CRLF or LF) compared record by record on a key.
 * Arguments: left, right (paths under /data), key (a header name; default the first column), max (default 200
 * entries a list). Columns are matched by header name. Result: {"key", "left_rows", "right_rows", "same",
 * "added": [key], "removed": [key], "changed": [{"key", "column", "left", "right"}], "columns_added",
 * "columns_removed", "truncated"}. A duplicate key is bad input (the diff would be ambiguous).
 * With keys=true the result is only which records differ, in a shape to hand on as it is: {"key", "left_rows",
 * "right_rows", "same", "differ": N, "value": [every key added, removed or changed, sorted, each once]}.
 */
#include "tool.h"

typedef struct {
    char **field;
    size_t n;
} Row;

typedef struct {
    Row *row;
    size_t n;
    const char *name;
} Table;

static void push(char ***list, size_t *n, size_t *cap, char *value) {
    if (*n == *cap) *list = xrealloc(*list, (*cap = *cap ? *cap * 2 : 8) * sizeof **list);
    (*list)[(*n)++] = value;
}

static Table parse(const char *rel) {
    size_t len;
    char *text = read_file(rel, &len);
    Table t = {NULL, 0, rel};
    size_t rows_cap = 0;
    size_t i = 0;
    while (i < len) {
        Row r = {NULL, 0};
        size_t fcap = 0;
        for (;;) {
            size_t cap = 32, n = 0;
            char *f = xmalloc(cap);
            if (i < len && text[i] == '"') {
                i++;
                for (;;) {
                    if (i >= len) fail("an unclosed quoted field", rel);
                    if (text[i] == '"') {
                        if (i + 1 < len && text[i + 1] == '"') i++;
                        else { i++; break; }
                    }
                    if (n + 1 >= cap) f = xrealloc(f, cap *= 2);
                    f[n++] = text[i++];
                }
            } else {
                while (i < len && text[i] != ',' && text[i] != '\n' && text[i] != '\r') {
                    if (n + 1 >= cap) f = xrealloc(f, cap *= 2);
                    f[n++] = text[i++];
                }
            }
            f[n] = 0;
            push(&r.field, &r.n, &fcap, f);
            if (i < len && text[i] == ',') { i++; continue; }
            if (i < len && text[i] == '\r') i++;
            if (i < len && text[i] == '\n') i++;
            break;
        }
        if (r.n == 1 && r.field[0][0] == 0) continue; /* an empty line */
        if (t.n == rows_cap) t.row = xrealloc(t.row, (rows_cap = rows_cap ? rows_cap * 2 : 64) * sizeof *t.row);
        t.row[t.n++] = r;
    }
    free(text);
    if (t.n == 0) fail("no header row", rel);
    return t;
}

static long column(const Table *t, const char *name) {
    for (size_t c = 0; c < t->row[0].n; c++)
        if (strcmp(t->row[0].field[c], name) == 0) return (long)c;
    return -1;
}

static const char *cell(const Row *r, long c) { return c >= 0 && (size_t)c < r->n ? r->field[c] : ""; }

static long sort_key;
static const Row *sort_rows;
static int by_key(const void *a, const void *b) {
    return strcmp(cell(&sort_rows[*(const size_t *)a], sort_key), cell(&sort_rows[*(const size_t *)b], sort_key));
}

static size_t *sorted(const Table *t, long key) {
    size_t *ix = xmalloc((t->n - 1) * sizeof *ix);
    for (size_t r = 1; r < t->n; r++) ix[r - 1] = r;
    sort_key = key;
    sort_rows = t->row;
    qsort(ix, t->n - 1, sizeof *ix, by_key);
    for (size_t r = 1; r + 1 < t->n; r++)
        if (strcmp(cell(&t->row[ix[r - 1]], key), cell(&t->row[ix[r]], key)) == 0)
            fail("a duplicate key", t->name);
    return ix;
}

static int by_text(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static long max_entries, listed;
static int keys_only;
static int truncated;

static int room(void) {
    if (keys_only) return 1; /* a key list is not cut: a finding that lost some records would be wrong */
    if (listed >= max_entries) { truncated = 1; return 0; }
    listed++;
    return 1;
}

static void list_missing_columns(const Table *a, const Table *b) {
    int first = 1;
    putchar('[');
    for (size_t c = 0; c < a->row[0].n; c++)
        if (column(b, a->row[0].field[c]) < 0) {
            if (!first) putchar(',');
            first = 0;
            put_json_cstr(a->row[0].field[c]);
        }
    putchar(']');
}

int main(int argc, char **argv) {
    Table left = parse(need_arg(argc, argv, "left"));
    Table right = parse(need_arg(argc, argv, "right"));
    max_entries = int_arg(argc, argv, "max", 200);
    if (max_entries < 1 || max_entries > 100000) fail("max must be 1..100000", NULL);
    const char *flag = arg(argc, argv, "keys", "false");
    if (strcmp(flag, "true") != 0 && strcmp(flag, "false") != 0) fail("keys must be true or false", flag);
    keys_only = strcmp(flag, "true") == 0;
    const char *key = arg(argc, argv, "key", left.row[0].field[0]);
    long kl = column(&left, key), kr = column(&right, key);
    if (kl < 0) fail("no such key column in left", key);
    if (kr < 0) fail("no such key column in right", key);
    size_t *il = sorted(&left, kl), *ir = sorted(&right, kr);
    size_t nl = left.n - 1, nr = right.n - 1, a = 0, b = 0;
    long same = 0;
    /* three lists, gathered in one merge pass and printed after it */
    char **added = NULL, **removed = NULL;
    size_t n_added = 0, n_removed = 0, cap_a = 0, cap_r = 0;
    typedef struct { const char *key, *column, *left, *right; } Change;
    Change *changes = NULL;
    size_t n_changes = 0, cap_c = 0;
    while (a < nl || b < nr) {
        int cmp = a >= nl ? 1 : b >= nr ? -1 : strcmp(cell(&left.row[il[a]], kl), cell(&right.row[ir[b]], kr));
        if (cmp < 0) {
            if (room()) push(&removed, &n_removed, &cap_r, (char *)cell(&left.row[il[a]], kl));
            a++;
        } else if (cmp > 0) {
            if (room()) push(&added, &n_added, &cap_a, (char *)cell(&right.row[ir[b]], kr));
            b++;
        } else {
            const Row *l = &left.row[il[a]], *r = &right.row[ir[b]];
            int differs = 0;
            for (size_t c = 0; c < left.row[0].n; c++) {
                long rc = column(&right, left.row[0].field[c]);
                if (rc < 0 || (long)c == kl) continue;
                if (strcmp(cell(l, (long)c), cell(r, rc)) != 0) {
                    differs = 1;
                    if (!room()) continue;
                    if (n_changes == cap_c) changes = xrealloc(changes, (cap_c = cap_c ? cap_c * 2 : 16) * sizeof *changes);
                    changes[n_changes++] = (Change){cell(l, kl), left.row[0].field[c], cell(l, (long)c), cell(r, rc)};
                }
            }
            same += !differs;
            a++;
            b++;
        }
    }
    if (keys_only) {
        /* every key that differs, sorted, each once (a changed record has one change a column) */
        size_t n_keys = 0;
        const char **keys = xmalloc((n_added + n_removed + n_changes) * sizeof *keys);
        for (size_t i = 0; i < n_added; i++) keys[n_keys++] = added[i];
        for (size_t i = 0; i < n_removed; i++) keys[n_keys++] = removed[i];
        for (size_t i = 0; i < n_changes; i++) keys[n_keys++] = changes[i].key;
        qsort(keys, n_keys, sizeof *keys, by_text);
        size_t differ = 0;
        for (size_t i = 0; i < n_keys; i++)
            if (i == 0 || strcmp(keys[i - 1], keys[i]) != 0) keys[differ++] = keys[i];
        fputs("{\"key\":", stdout);
        put_json_cstr(key);
        printf(",\"left_rows\":%zu,\"right_rows\":%zu,\"same\":%ld,\"differ\":%zu,\"value\":[", nl, nr, same,
               differ);
        for (size_t i = 0; i < differ; i++) { if (i) putchar(','); put_json_cstr(keys[i]); }
        puts("]}");
        return 0;
    }
    fputs("{\"key\":", stdout);
    put_json_cstr(key);
    printf(",\"left_rows\":%zu,\"right_rows\":%zu,\"same\":%ld,\"added\":[", nl, nr, same);
    for (size_t i = 0; i < n_added; i++) { if (i) putchar(','); put_json_cstr(added[i]); }
    fputs("],\"removed\":[", stdout);
    for (size_t i = 0; i < n_removed; i++) { if (i) putchar(','); put_json_cstr(removed[i]); }
    fputs("],\"changed\":[", stdout);
    for (size_t i = 0; i < n_changes; i++) {
        if (i) putchar(',');
        fputs("{\"key\":", stdout); put_json_cstr(changes[i].key);
        fputs(",\"column\":", stdout); put_json_cstr(changes[i].column);
        fputs(",\"left\":", stdout); put_json_cstr(changes[i].left);
        fputs(",\"right\":", stdout); put_json_cstr(changes[i].right);
        putchar('}');
    }
    fputs("],\"columns_added\":", stdout);
    list_missing_columns(&right, &left);
    fputs(",\"columns_removed\":", stdout);
    list_missing_columns(&left, &right);
    printf(",\"truncated\":%s}\n", truncated ? "true" : "false");
    return 0;
}
