/* Speaks a sentence into a 16-bit WAV file through the C ABI, reading the audio as it is made.
 *
 *   cc examples/c/speak_wav.c -Icrates/c/include -L$LIBDIR -lqtts_c -o speak_wav
 *   ./speak_wav out.wav "Hello from C." [MODEL [CORES [VOICE]]]
 *
 * MODEL: a model folder or file, or `builtin` (the default: the built-in test model, noise).
 * CORES: cores to use (default: all). VOICE: a speaker or a saved voice (default: the model's). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qtts.h"

static void put_u32(FILE *f, uint32_t v) {
    unsigned char b[4] = {v & 0xff, (v >> 8) & 0xff, (v >> 16) & 0xff, (v >> 24) & 0xff};
    fwrite(b, 1, 4, f);
}

static void put_u16(FILE *f, uint16_t v) {
    unsigned char b[2] = {v & 0xff, (v >> 8) & 0xff};
    fwrite(b, 1, 2, f);
}

/* A mono 16-bit WAV header for `samples` samples at `rate`. */
static void wav_header(FILE *f, uint32_t rate, uint32_t samples) {
    fwrite("RIFF", 1, 4, f);
    put_u32(f, 36 + samples * 2);
    fwrite("WAVEfmt ", 1, 8, f);
    put_u32(f, 16);
    put_u16(f, 1); /* PCM */
    put_u16(f, 1); /* mono */
    put_u32(f, rate);
    put_u32(f, rate * 2);
    put_u16(f, 2);
    put_u16(f, 16);
    fwrite("data", 1, 4, f);
    put_u32(f, samples * 2);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s OUT.wav TEXT [MODEL [CORES [VOICE]]]\n", argv[0]);
        return 2;
    }
    if (qtts_abi_version() != QTTS_ABI_VERSION) {
        fprintf(stderr, "libqtts_c has ABI %u, this program was built for %u\n", qtts_abi_version(),
                QTTS_ABI_VERSION);
        return 1;
    }
    QttsOptions opts;
    qtts_options_init(&opts);
    opts.model = argc > 3 && argv[3][0] ? argv[3] : "builtin";
    opts.cores = argc > 4 ? (uint32_t)atoi(argv[4]) : 0;
    QttsEngine *engine = NULL;
    if (qtts_engine_load(&opts, &engine) != QTTS_OK) {
        fprintf(stderr, "loading the model: %s\n", qtts_last_error());
        return 1;
    }
    if (qtts_engine_is_builtin(engine)) {
        fprintf(stderr, "note: the built-in test model speaks noise, not speech\n");
    }
    QttsRequest req;
    qtts_request_init(&req);
    req.text = argv[2];
    req.voice = argc > 5 && argv[5][0] ? argv[5] : NULL;
    QttsSynthesis *s = NULL;
    if (qtts_synthesize(engine, &req, &s) != QTTS_OK) {
        fprintf(stderr, "synthesize: %s\n", qtts_last_error());
        qtts_engine_free(engine);
        return 1;
    }
    FILE *out = fopen(argv[1], "wb");
    if (!out) {
        perror(argv[1]);
        qtts_synthesis_free(s);
        qtts_engine_free(engine);
        return 1;
    }
    wav_header(out, qtts_sample_rate(), 0); /* sizes patched at the end */
    float buf[4096];
    uint32_t total = 0;
    int64_t n;
    /* Each read waits up to a second; a timeout only means the audio is not there yet. */
    while ((n = qtts_read(s, buf, sizeof buf / sizeof buf[0], 1000)) != 0) {
        if (n == QTTS_ERR_TIMEOUT) continue;
        if (n < 0) {
            fprintf(stderr, "synthesis failed: %s\n", qtts_last_error());
            break;
        }
        for (int64_t i = 0; i < n; i++) {
            float x = buf[i] < -1.0f ? -1.0f : buf[i] > 1.0f ? 1.0f : buf[i];
            put_u16(out, (uint16_t)(int16_t)(x * 32767.0f));
        }
        total += (uint32_t)n;
    }
    QttsSummary sum;
    int ok = n == 0 && qtts_synthesis_summary(s, &sum) == QTTS_OK;
    rewind(out);
    wav_header(out, qtts_sample_rate(), total);
    fclose(out);
    if (ok) {
        static const char *const stops[] = {"end of speech", "frame cap", "cancelled"};
        printf("%s: %u samples (%.2f s), %llu frames, first audio after %.1f ms, RTF %.2f, "
               "ended by %s\n",
               argv[1], total, total / (double)qtts_sample_rate(), (unsigned long long)sum.frames,
               sum.ttfa_ms, sum.rtf, sum.stop >= 0 && sum.stop <= 2 ? stops[sum.stop] : "?");
    }
    qtts_synthesis_free(s);
    qtts_engine_free(engine);
    return ok ? 0 : 1;
}
