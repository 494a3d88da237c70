/*
 * jsonquery: one value picked out of a JSON file by a path such as .orders[2].total or .["a key"].
 * Arguments: path (a file under /data), query ("." is the whole document). The file is checked as JSON whole.
 * Result: {"found": true, "type": "object|array|string|number|boolean|null", "value": <the value>,
 * "length": N (objects and arrays)} or {"found": false, "missing": "<the step not found>"}.
 */
#include "tool.h"

static const char *doc, *end_of_doc;
static int depth;

static const char *ws(const char *p) {
    while (p < end_of_doc && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    return p;
}

static void bad(const char *p) {
    char where[64];
    snprintf(where, sizeof where, "at byte %ld", (long)(p - doc));
    fail("the file is not valid JSON", where);
}

static const char *skip_string(const char *p) {
    if (p >= end_of_doc || *p != '"') bad(p);
    for (p++; p < end_of_doc; p++) {
        if (*p == '"') return p + 1;
        if ((unsigned char)*p < 0x20) bad(p);
        if (*p == '\\') {
            p++;
            if (p >= end_of_doc) bad(p);
            if (*p == 'u') {
                for (int i = 1; i <= 4; i++)
                    if (p + i >= end_of_doc || !strchr("0123456789abcdefABCDEF", p[i]) || !p[i]) bad(p);
                p += 4;
            } else if (!strchr("\"\\/bfnrt", *p) || !*p) {
                bad(p);
            }
        }
    }
    bad(p);
    return p;
}

static const char *skip_value(const char *p);

static const char *skip_number(const char *p) {
    const char *s = p;
    if (p < end_of_doc && *p == '-') p++;
    if (p < end_of_doc && *p == '0') p++;
    else if (p < end_of_doc && *p >= '1' && *p <= '9') while (p < end_of_doc && *p >= '0' && *p <= '9') p++;
    else bad(s);
    if (p < end_of_doc && *p == '.') {
        p++;
        if (p >= end_of_doc || *p < '0' || *p > '9') bad(p);
        while (p < end_of_doc && *p >= '0' && *p <= '9') p++;
    }
    if (p < end_of_doc && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end_of_doc && (*p == '+' || *p == '-')) p++;
        if (p >= end_of_doc || *p < '0' || *p > '9') bad(p);
        while (p < end_of_doc && *p >= '0' && *p <= '9') p++;
    }
    return p;
}

static const char *skip_word(const char *p, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(end_of_doc - p) < n || memcmp(p, word, n) != 0) bad(p);
    return p + n;
}

static const char *skip_value(const char *p) {
    p = ws(p);
    if (p >= end_of_doc) bad(p);
    if (++depth > 512) fail("the JSON nests deeper than 512 levels", NULL);
    const char *q;
    switch (*p) {
    case '{':
        p = ws(p + 1);
        if (p < end_of_doc && *p == '}') { q = p + 1; break; }
        for (;;) {
            p = ws(skip_string(ws(p)));
            if (p >= end_of_doc || *p != ':') bad(p);
            p = ws(skip_value(p + 1));
            if (p < end_of_doc && *p == ',') { p++; continue; }
            if (p < end_of_doc && *p == '}') { q = p + 1; break; }
            bad(p);
        }
        break;
    case '[':
        p = ws(p + 1);
        if (p < end_of_doc && *p == ']') { q = p + 1; break; }
        for (;;) {
            p = ws(skip_value(p));
            if (p < end_of_doc && *p == ',') { p++; continue; }
            if (p < end_of_doc && *p == ']') { q = p + 1; break; }
            bad(p);
        }
        break;
    case '"': q = skip_string(p); break;
    case 't': q = skip_word(p, "true"); break;
    case 'f': q = skip_word(p, "false"); break;
    case 'n': q = skip_word(p, "null"); break;
    default: q = skip_number(p);
    }
    depth--;
    return q;
}

/* Whether the JSON string literal at P (validated) equals KEY of KLEN bytes; only simple escapes are decoded. */
static int key_is(const char *p, const char *key, size_t klen) {
    size_t i = 0;
    for (p++; *p != '"'; p++) {
        char c = *p;
        if (c == '\\') {
            p++;
            switch (*p) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'u': return 0; /* a \u escape in a key: not matched (said in the tool's description) */
            default: c = *p;
            }
        }
        if (i >= klen || key[i] != c) return 0;
        i++;
    }
    return i == klen;
}

static const char *member(const char *p, const char *key, size_t klen) {
    p = ws(p);
    if (*p != '{') return NULL;
    p = ws(p + 1);
    if (*p == '}') return NULL;
    for (;;) {
        const char *k = ws(p);
        p = ws(skip_string(k));
        p = ws(p + 1);
        if (key_is(k, key, klen)) return p;
        p = ws(skip_value(p));
        if (*p == '}') return NULL;
        p++;
    }
}

static const char *element(const char *p, long index) {
    p = ws(p);
    if (*p != '[') return NULL;
    p = ws(p + 1);
    if (*p == ']') return NULL;
    for (long i = 0;; i++) {
        p = ws(p);
        if (i == index) return p;
        p = ws(skip_value(p));
        if (*p == ']') return NULL;
        p++;
    }
}

static long count(const char *p) {
    p = ws(p);
    char close = *p == '{' ? '}' : ']';
    p = ws(p + 1);
    if (*p == close) return 0;
    long n = 0;
    for (;;) {
        if (close == '}') p = ws(ws(skip_string(ws(p))) + 1);
        p = ws(skip_value(p));
        n++;
        if (*p == close) return n;
        p++;
    }
}

static void not_found(const char *step, size_t n) {
    fputs("{\"found\":false,\"missing\":", stdout);
    put_json_string(step, n);
    puts("}");
    exit(0);
}

int main(int argc, char **argv) {
    size_t len;
    doc = read_file(need_arg(argc, argv, "path"), &len);
    end_of_doc = doc + len;
    const char *q = need_arg(argc, argv, "query");
    if (*ws(skip_value(doc)) != 0 || ws(skip_value(doc)) != end_of_doc) bad(ws(skip_value(doc)));
    const char *at = ws(doc);
    if (*q != '.') fail("a query starts with '.'", q);
    const char *s = q;
    if (s[1] == 0) s++;
    while (*s) {
        const char *step = s;
        if (s[0] == '.' && s[1] == '[') s++;
        if (*s == '.') {
            s++;
            const char *k = s;
            while (*s && *s != '.' && *s != '[') s++;
            if (s == k) fail("an empty key in the query", q);
            at = member(at, k, (size_t)(s - k));
        } else if (*s == '[' && s[1] == '"') {
            s += 2;
            char key[1024];
            size_t n = 0;
            while (*s && *s != '"' && n < sizeof key) key[n++] = *s++;
            if (s[0] != '"' || s[1] != ']') fail("a quoted key is [\"...\"]", q);
            s += 2;
            at = member(at, key, n);
        } else if (*s == '[') {
            char *end;
            long index = strtol(s + 1, &end, 10);
            if (end == s + 1 || *end != ']' || index < 0) fail("an index is [N] with N >= 0", q);
            s = end + 1;
            at = element(at, index);
        } else {
            fail("a step is .key, [\"key\"] or [N]", q);
        }
        if (!at) not_found(step, (size_t)(s - step));
    }
    const char *stop = skip_value(at);
    const char *type = *at == '{' ? "object" : *at == '[' ? "array" : *at == '"' ? "string"
                     : *at == 't' || *at == 'f' ? "boolean" : *at == 'n' ? "null" : "number";
    printf("{\"found\":true,\"type\":\"%s\",", type);
    if (*at == '{' || *at == '[') printf("\"length\":%ld,", count(at));
    fputs("\"value\":", stdout);
    fwrite(at, 1, (size_t)(stop - at), stdout);
    puts("}");
    return 0;
}
