/* The smallest tool: answers {"ok": true, "args": N}, the benchmark's trivial call. With write=NAME it also writes
 * a file NAME under /data (a writer tool's test: the folder is read-only unless the tool is declared a writer). */
#include "tool.h"

int main(int argc, char **argv) {
    const char *target = arg(argc, argv, "write", NULL);
    if (target) {
        char *path = data_path(target);
        FILE *f = fopen(path, "w");
        if (!f || fputs("written\n", f) < 0 || fclose(f) != 0) fail(strerror(errno), target);
        free(path);
    }
    printf("{\"ok\":true,\"args\":%d}\n", argc - 1);
    return 0;
}
