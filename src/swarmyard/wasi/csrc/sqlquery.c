/*
 * sqlquery: one read-only SQL query (SQLite) over a database file, or over a CSV file loaded into a table of an
 * in-memory database, both under /data. Built with SQLite's amalgamation (see swarmyard.wasi.build).
 * Arguments: query; database (an SQLite file, opened read-only and immutable) or csv (RFC 4180, a header row:
 * its names are the table's columns; a field that reads whole as an integer or a real is stored as one, an empty
 * field is NULL, anything else is text); table (the CSV's table, default "data"); max_rows (default 100).
 * Result: {"columns": [name], "rows": [[value]], "row_count": N, "truncated": bool}; a value is a JSON number,
 * string or null, a blob {"hex": "..."}. One statement, and one that only reads (else bad input); no ATTACH.
 */
#include <math.h>

#include "sqlite3.h"
#include "tool.h"

static sqlite3 *db;

static void check(int rc, const char *what) {
    if (rc == SQLITE_OK || rc == SQLITE_DONE || rc == SQLITE_ROW) return;
    if (rc == SQLITE_NOMEM) {
        fputs("out of memory\n", stderr);
        exit(EXIT_NO_MEMORY);
    }
    fail(what, db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
}

/* An SQL identifier: double quotes around it, each one inside doubled. */
static char *quoted(const char *name) {
    size_t n = strlen(name), k = 0;
    char *out = xmalloc(2 * n + 3);
    out[k++] = '"';
    for (size_t i = 0; i < n; i++) {
        if (name[i] == '"') out[k++] = '"';
        out[k++] = name[i];
    }
    out[k++] = '"';
    out[k] = 0;
    return out;
}

/* The next CSV field of TEXT from *I (unquoted into a fresh string); *END_OF_ROW set at a line's end. */
static char *next_field(const char *text, size_t len, size_t *i, int *end_of_row, const char *rel) {
    size_t cap = 32, n = 0;
    char *f = xmalloc(cap);
    if (*i < len && text[*i] == '"') {
        (*i)++;
        for (;;) {
            if (*i >= len) fail("an unclosed quoted field", rel);
            if (text[*i] == '"') {
                if (*i + 1 < len && text[*i + 1] == '"') (*i)++;
                else { (*i)++; break; }
            }
            if (n + 1 >= cap) f = xrealloc(f, cap *= 2);
            f[n++] = text[(*i)++];
        }
    } else {
        while (*i < len && text[*i] != ',' && text[*i] != '\n' && text[*i] != '\r') {
            if (n + 1 >= cap) f = xrealloc(f, cap *= 2);
            f[n++] = text[(*i)++];
        }
    }
    f[n] = 0;
    *end_of_row = 1;
    if (*i < len && text[*i] == ',') { (*i)++; *end_of_row = 0; }
    else {
        if (*i < len && text[*i] == '\r') (*i)++;
        if (*i < len && text[*i] == '\n') (*i)++;
    }
    return f;
}

static void bind_field(sqlite3_stmt *insert, int column, const char *value) {
    if (!*value) { check(sqlite3_bind_null(insert, column), "bind"); return; }
    char *end;
    errno = 0;
    long long n = strtoll(value, &end, 10);
    if (!*end && errno == 0) { check(sqlite3_bind_int64(insert, column, n), "bind"); return; }
    double d = strtod(value, &end);
    if (!*end && isfinite(d)) { check(sqlite3_bind_double(insert, column, d), "bind"); return; }
    check(sqlite3_bind_text(insert, column, value, -1, SQLITE_TRANSIENT), "bind");
}

/* Load the CSV file REL into table NAME of the in-memory database. */
static void load_csv(const char *rel, const char *name) {
    size_t len, i = 0;
    char *text = read_file(rel, &len);
    if (len == 0) fail("the CSV file is empty (it needs a header row)", rel);
    char *table = quoted(name);
    size_t sql_cap = strlen(table) + 64, sql_n = 0, ncols = 0;
    char *create = xmalloc(sql_cap);
    sql_n = (size_t)snprintf(create, sql_cap, "CREATE TABLE %s (", table);
    for (int end = 0; !end;) {
        char *field = next_field(text, len, &i, &end, rel);
        char *column = quoted(field);
        size_t need = sql_n + strlen(column) + 4;
        if (need >= sql_cap) create = xrealloc(create, sql_cap = 2 * need);
        sql_n += (size_t)snprintf(create + sql_n, sql_cap - sql_n, "%s%s", ncols ? ", " : "", column);
        ncols++;
        free(column);
        free(field);
    }
    if (sql_n + 2 >= sql_cap) create = xrealloc(create, sql_cap += 2);
    memcpy(create + sql_n, ")", 2);
    check(sqlite3_exec(db, create, NULL, NULL, NULL), "cannot make the CSV's table");
    free(create);
    char *insert_sql = xmalloc(strlen(table) + 32 + 2 * ncols);
    size_t k = (size_t)sprintf(insert_sql, "INSERT INTO %s VALUES (", table);
    for (size_t c = 0; c < ncols; c++) k += (size_t)sprintf(insert_sql + k, c ? ",?" : "?");
    memcpy(insert_sql + k, ")", 2);
    sqlite3_stmt *insert;
    check(sqlite3_prepare_v2(db, insert_sql, -1, &insert, NULL), "cannot load the CSV");
    check(sqlite3_exec(db, "BEGIN", NULL, NULL, NULL), "cannot load the CSV");
    long row = 1;
    while (i < len) {
        row++;
        if (text[i] == '\n' || text[i] == '\r') { i++; continue; } /* a blank line holds no record */
        size_t c = 0;
        for (int end = 0; !end;) {
            char *field = next_field(text, len, &i, &end, rel);
            if (c >= ncols) {
                char where[96];
                snprintf(where, sizeof where, "%s, row %ld", rel, row);
                fail("a row has more fields than the header", where);
            }
            bind_field(insert, (int)++c, field);
            free(field);
        }
        check(sqlite3_step(insert), "cannot load the CSV");
        check(sqlite3_reset(insert), "cannot load the CSV");
        check(sqlite3_clear_bindings(insert), "cannot load the CSV");
    }
    check(sqlite3_finalize(insert), "cannot load the CSV");
    check(sqlite3_exec(db, "COMMIT", NULL, NULL, NULL), "cannot load the CSV");
    free(insert_sql);
    free(table);
    free(text);
}

/* "file:" URI of /data/REL, read-only and immutable (no locks, no journal: the folder may be read-only). */
static char *database_uri(const char *rel) {
    char *path = data_path(rel);
    size_t n = strlen(path);
    char *uri = xmalloc(3 * n + 32);
    size_t k = (size_t)sprintf(uri, "file:");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)path[i];
        if (c == '%' || c == '?' || c == '#' || c < 0x20 || c >= 0x7f) k += (size_t)sprintf(uri + k, "%%%02X", c);
        else uri[k++] = (char)c;
    }
    strcpy(uri + k, "?mode=ro&immutable=1");
    free(path);
    return uri;
}

static void put_value(sqlite3_stmt *stmt, int column) {
    switch (sqlite3_column_type(stmt, column)) {
    case SQLITE_INTEGER:
        printf("%lld", (long long)sqlite3_column_int64(stmt, column));
        break;
    case SQLITE_FLOAT: {
        double d = sqlite3_column_double(stmt, column);
        if (isfinite(d)) printf("%.17g", d);
        else fputs("null", stdout);
        break;
    }
    case SQLITE_TEXT:
        put_json_string((const char *)sqlite3_column_text(stmt, column), (size_t)sqlite3_column_bytes(stmt, column));
        break;
    case SQLITE_BLOB: {
        const unsigned char *b = sqlite3_column_blob(stmt, column);
        int n = sqlite3_column_bytes(stmt, column);
        fputs("{\"hex\":\"", stdout);
        for (int i = 0; i < n; i++) printf("%02x", b[i]);
        fputs("\"}", stdout);
        break;
    }
    default:
        fputs("null", stdout);
    }
}

int main(int argc, char **argv) {
    const char *query = need_arg(argc, argv, "query");
    const char *database = arg(argc, argv, "database", NULL), *csv = arg(argc, argv, "csv", NULL);
    long max_rows = int_arg(argc, argv, "max_rows", 100);
    if (max_rows < 1 || max_rows > 10000) fail("max_rows must be 1..10000", NULL);
    if ((database != NULL) == (csv != NULL)) fail("give exactly one of database and csv", NULL);
    if (database) {
        char *uri = database_uri(database);
        check(sqlite3_open_v2(uri, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, NULL), "cannot open the database");
        free(uri);
        /* a file that is not a database fails here, at its first read, rather than at the query */
        check(sqlite3_exec(db, "SELECT count(*) FROM sqlite_schema", NULL, NULL, NULL), database);
    } else {
        check(sqlite3_open_v2(":memory:", &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL), "sqlite");
        load_csv(csv, arg(argc, argv, "table", "data"));
    }
    sqlite3_limit(db, SQLITE_LIMIT_ATTACHED, 0); /* no ATTACH: the query reads what it was given, nothing else */
    sqlite3_db_config(db, SQLITE_DBCONFIG_DEFENSIVE, 1, NULL);
    sqlite3_stmt *stmt;
    const char *tail;
    check(sqlite3_prepare_v2(db, query, -1, &stmt, &tail), "the query");
    if (!stmt) fail("the query is empty", NULL);
    while (*tail == ' ' || *tail == '\t' || *tail == '\n' || *tail == '\r' || *tail == ';') tail++;
    if (*tail) fail("one statement only", tail);
    if (!sqlite3_stmt_readonly(stmt)) fail("the query must only read (SELECT, WITH, a read-only PRAGMA)", NULL);
    int ncols = sqlite3_column_count(stmt);
    fputs("{\"columns\":[", stdout);
    for (int c = 0; c < ncols; c++) {
        if (c) putchar(',');
        put_json_cstr(sqlite3_column_name(stmt, c));
    }
    fputs("],\"rows\":[", stdout);
    long rows = 0;
    int rc, truncated = 0;
    while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
        if (rows == max_rows) { truncated = 1; break; }
        if (rows++) putchar(',');
        putchar('[');
        for (int c = 0; c < ncols; c++) {
            if (c) putchar(',');
            put_value(stmt, c);
        }
        putchar(']');
    }
    check(rc, "the query");
    printf("],\"row_count\":%ld,\"truncated\":%s}\n", rows, truncated ? "true" : "false");
    sqlite3_finalize(stmt);
    sqlite3_close(db);
    return 0;
}
