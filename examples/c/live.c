/* Speaks a text while it is written: its first words go with the request, the first audio is
 * read before any more text is written (so speech starts while the text is incomplete), then a
 * second thread writes the rest a few bytes at a time, as a language model would (splitting a
 * character too) while this one reads. Checks that the summary adds up.
 *
 *   cc examples/c/live.c -Icrates/c/include -L$LIBDIR -lqtts_c -lpthread -o live
 *   ./live [MODEL [CORES]]      (MODEL "" or absent: builtin, as speak_wav.c)
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qtts.h"

static const char TEXT[] = "Hello there, I am written while I speak. Caf\xc3\xa9 au lait?";

static void *write_text(void *arg) {
    QttsSynthesis *s = arg;
    struct timespec d = {0, 20 * 1000 * 1000}; /* 20 ms between pieces */
    size_t len = strlen(TEXT);
    /* The first words went with the request; the rest in pieces of 3 bytes. */
    for (size_t at = strlen("Hello there,"); at < len; at += 3) {
        nanosleep(&d, NULL);
        size_t n = len - at < 3 ? len - at : 3;
        int32_t st = qtts_feed_text(s, TEXT + at, n);
        if (st == QTTS_ERR_ENDED) return NULL; /* cancelled: stop writing */
        if (st != QTTS_OK) {
            fprintf(stderr, "feed: %s\n", qtts_last_error());
            return NULL;
        }
    }
    if (qtts_finish_text(s) != QTTS_OK) fprintf(stderr, "finish: %s\n", qtts_last_error());
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
    req.live = 1;
    req.text = "Hello there,"; /* the first piece: 12 bytes */
    req.max_frames = 24;       /* the built-in model never ends by itself */
    req.min_frames = 24;
    QttsSynthesis *s = NULL;
    if (qtts_synthesize(engine, &req, &s) != QTTS_OK) {
        fprintf(stderr, "synthesize: %s\n", qtts_last_error());
        qtts_engine_free(engine);
        return 1;
    }
    float buf[2048];
    /* Only the first words are written: the first audio must come without the rest. */
    int64_t n = qtts_read(s, buf, 2048, 120000), total = n > 0 ? n : 0;
    int early = n > 0;
    pthread_t t;
    pthread_create(&t, NULL, write_text, s);
    while (n > 0 && (n = qtts_read(s, buf, 2048, -1)) > 0) total += n;
    pthread_join(t, NULL);
    QttsSummary sum;
    int status = 1;
    if (!early) {
        fprintf(stderr, "no audio from the first words alone: %s\n", qtts_last_error());
    } else if (n != 0) {
        fprintf(stderr, "read failed: %s\n", qtts_last_error());
    } else if (qtts_synthesis_summary(s, &sum) != QTTS_OK) {
        fprintf(stderr, "summary: %s\n", qtts_last_error());
    } else if (sum.frames != 24 || (int64_t)sum.samples != total) {
        fprintf(stderr, "expected 24 frames, got %llu, and %lld samples read of %llu\n",
                (unsigned long long)sum.frames, (long long)total,
                (unsigned long long)sum.samples);
    } else {
        printf("spoke %lld samples, the first before the text was complete; %llu frames waited "
               "for text\n", (long long)total, (unsigned long long)sum.text_starved_frames);
        status = 0;
    }
    qtts_synthesis_free(s);
    qtts_engine_free(engine);
    return status;
}
