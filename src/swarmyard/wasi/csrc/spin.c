/* A tool that never ends (the fuel and wall-clock caps' test and benchmark), or that asks for memory without end
 * (mode=grow: the memory cap's). */
#include "tool.h"

struct block {
    struct block *next;
    char bytes[(1 << 20) - sizeof(struct block *)];
};

static struct block *volatile kept;

int main(int argc, char **argv) {
    const char *mode = arg(argc, argv, "mode", "loop");
    if (strcmp(mode, "grow") == 0) {
        for (;;) {
            struct block *b = xmalloc(sizeof *b);
            memset(b->bytes, 1, sizeof b->bytes);
            b->next = kept;
            kept = b;
        }
    }
    volatile unsigned long n = 0;
    for (;;) n++;
}
