/* A program built against an earlier qtts.h (QTTS_OLD_HEADER: qtts-v1.h, the first header, or
 * qtts-v1-voices.h, the one that first had `cloned_voice`), run against today's library. Every
 * struct the library fills or reads sits between guard words; the program speaks with the
 * built-in model and checks that no guard changed and that the library read what it set.
 *
 *   cc -Icrates/c/tests/old -DQTTS_OLD_HEADER='"qtts-v1.h"' old_caller.c -lqtts_c -o old_caller
 *   ./old_caller
 *
 * Exit 0: spoken, guards intact. 1: a guard changed or a call failed. */
#include <stdio.h>
#include <string.h>

#include QTTS_OLD_HEADER

#define GUARD 0xA5A5A5A5DEADBEEFull

/* A struct with a guard word on each side, as the caller's stack or heap would have its
 * neighbours. */
#define GUARDED(T, name)    \
    struct {                \
        uint64_t before;    \
        T value;            \
        uint64_t after[4];  \
    } name

static int guards_ok(const char *what, uint64_t before, const uint64_t after[4]) {
    int ok = before == GUARD;
    for (int i = 0; i < 4; i++) ok &= after[i] == GUARD;
    if (!ok) fprintf(stderr, "%s: a guard word next to it was overwritten\n", what);
    return ok;
}

static void set_guards(uint64_t *before, uint64_t after[4]) {
    *before = GUARD;
    for (int i = 0; i < 4; i++) after[i] = GUARD;
}

int main(void) {
    int ok = 1;
    GUARDED(QttsOptions, opts);
    set_guards(&opts.before, opts.after);
    if (qtts_options_init(&opts.value) != QTTS_OK) return 1;
    ok &= guards_ok("QttsOptions", opts.before, opts.after);
    if (opts.value.size != sizeof opts.value) {
        fprintf(stderr, "QttsOptions.size: expected %zu, found %zu\n", sizeof opts.value,
                opts.value.size);
        ok = 0;
    }
    opts.value.model = "builtin";
    opts.value.threads = 1;
    QttsEngine *engine = NULL;
    if (qtts_engine_load(&opts.value, &engine) != QTTS_OK) {
        fprintf(stderr, "load: %s\n", qtts_last_error());
        return 1;
    }

    GUARDED(QttsRequest, req);
    set_guards(&req.before, req.after);
    if (qtts_request_init(&req.value) != QTTS_OK) return 1;
    ok &= guards_ok("QttsRequest", req.before, req.after);
    req.value.text = "Hello from an old program.";
    req.value.language = "english";
    req.value.seed = 7;
    req.value.max_frames = 6;
    req.value.min_frames = 6;
    QttsSynthesis *s = NULL;
    if (qtts_synthesize(engine, &req.value, &s) != QTTS_OK) {
        fprintf(stderr, "synthesize: %s\n", qtts_last_error());
        return 1;
    }
    float buf[4096];
    long long total = 0;
    int64_t n;
    while ((n = qtts_read(s, buf, sizeof buf / sizeof buf[0], -1)) > 0) total += n;
    if (n != 0) {
        fprintf(stderr, "read: %s\n", qtts_last_error());
        return 1;
    }

    GUARDED(QttsSummary, sum);
    set_guards(&sum.before, sum.after);
    memset(&sum.value, 0, sizeof sum.value);
    if (qtts_synthesis_summary(s, &sum.value) != QTTS_OK) {
        fprintf(stderr, "summary: %s\n", qtts_last_error());
        return 1;
    }
    ok &= guards_ok("QttsSummary", sum.before, sum.after);
    /* min_frames = max_frames = 6 fixes the length: the library read the fields this header has. */
    if (sum.value.frames != 6 || total != 6 * 1920 || (long long)sum.value.samples != total ||
        sum.value.cancelled != 0 || !(sum.value.ttfa_ms > 0)) {
        fprintf(stderr, "summary: expected 6 frames, %d samples, not cancelled, found %llu frames, "
                "%llu samples (%lld read), cancelled %d, first audio %.1f ms\n", 6 * 1920,
                (unsigned long long)sum.value.frames, (unsigned long long)sum.value.samples, total,
                sum.value.cancelled, sum.value.ttfa_ms);
        ok = 0;
    }
    qtts_synthesis_free(s);
    qtts_engine_free(engine);
    printf("%s: %lld samples, guards %s\n", QTTS_OLD_HEADER, total, ok ? "intact" : "BROKEN");
    return ok ? 0 : 1;
}
