/* Cancels a synthesis mid-sentence from a second thread while the main thread reads it, and
 * checks that the read ends promptly and the summary says so.
 *
 *   cc examples/c/cancel.c -Icrates/c/include -L$LIBDIR -lqtts_c -lpthread -o cancel
 *   ./cancel [MODEL [CORES]]      (MODEL "" or absent: builtin, as speak_wav.c)
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "qtts.h"

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static double cancelled_at; /* written before the cancel, read after the join */

static void *cancel_later(void *arg) {
    struct timespec d = {0, 300 * 1000 * 1000}; /* 300 ms */
    nanosleep(&d, NULL);
    cancelled_at = now_ms();
    qtts_cancel((QttsSynthesis *)arg);
    return NULL;
}

int main(int argc, char **argv) {
    QttsOptions opts;
    qtts_options_init(&opts);
    opts.model = argc > 1 && argv[1][0] ? argv[1] : "builtin";
    opts.cores = argc > 2 ? (uint32_t)atoi(argv[2]) : 0;
    QttsEngine *engine = NULL;
    if (qtts_engine_load(&opts, &engine) != QTTS_OK) {
        fprintf(stderr, "loading the model: %s\n", qtts_last_error());
        return 1;
    }
    QttsRequest req;
    qtts_request_init(&req);
    req.text = "This sentence is long enough that it will still be speaking when the second "
               "thread cancels it, a little after it starts.";
    /* 40 seconds of audio at most, and no early end: only the cancel stops it. */
    req.max_frames = 500;
    req.min_frames = 500;
    QttsSynthesis *s = NULL;
    if (qtts_synthesize(engine, &req, &s) != QTTS_OK) {
        fprintf(stderr, "synthesize: %s\n", qtts_last_error());
        qtts_engine_free(engine);
        return 1;
    }
    pthread_t t;
    pthread_create(&t, NULL, cancel_later, s);
    float buf[2048];
    int64_t n, total = 0;
    while ((n = qtts_read(s, buf, 2048, -1)) > 0) total += n;
    double end = now_ms();
    pthread_join(t, NULL);
    QttsSummary sum;
    int status = 1;
    if (n != 0) {
        fprintf(stderr, "read failed: %s\n", qtts_last_error());
    } else if (qtts_synthesis_summary(s, &sum) != QTTS_OK) {
        fprintf(stderr, "summary: %s\n", qtts_last_error());
    } else if (!sum.cancelled || sum.stop != QTTS_STOP_CANCELLED || sum.frames >= 500) {
        fprintf(stderr, "expected a cancelled synthesis, got %llu frames, cancelled=%d, stop=%d\n",
                (unsigned long long)sum.frames, sum.cancelled, sum.stop);
    } else {
        printf("cancelled after %llu frames (%lld samples read); the read ended %.1f ms after "
               "the cancel\n",
               (unsigned long long)sum.frames, (long long)total, end - cancelled_at);
        status = 0;
    }
    qtts_synthesis_free(s);
    qtts_engine_free(engine);
    return status;
}
