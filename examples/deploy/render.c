/* Render a model exported by train_and_export.py at 512 x 512 from C, without Python, and write it as a PPM.

       cc examples/deploy/render.c -o render $(python -m tinn.deploy --cflags --libs)
       ./render deploy_model render.ppm [REPEATS]

   Pixel (i, j) is the model at ((i + 0.5) / 512, (j + 0.5) / 512), x right, y down. With REPEATS, the inference
   runs that many more times and the median time of one is printed (the first run pays the kernel's compile). */
#define _POSIX_C_SOURCE 199309L            /* clock_gettime */
#include <tinn_model.h>
#include <time.h>

#define SIZE 512

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    const int32_t n = SIZE * SIZE;
    int repeats = argc > 3 ? atoi(argv[3]) : 0, i;
    tinn_model *m;
    float *x, *y;
    FILE *out;

    if (argc < 3) { fprintf(stderr, "usage: %s MODEL_FOLDER OUT.ppm [REPEATS]\n", argv[0]); return 1; }
    m = tinn_model_open(argv[1], "vulkan");
    if (!m) { fprintf(stderr, "%s\n", tinn_model_last_error()); return 1; }
    if (tinn_model_n_inputs(m) != 2 || tinn_model_n_outputs(m) != 3) {
        fprintf(stderr, "expected a model of 2 inputs and 3 outputs, got %d and %d\n", (int)tinn_model_n_inputs(m),
                (int)tinn_model_n_outputs(m));
        tinn_model_close(m);
        return 1;
    }
    x = (float *)malloc(sizeof(float) * 2 * (size_t)n);
    y = (float *)malloc(sizeof(float) * 3 * (size_t)n);
    for (i = 0; i < n; i++) {
        x[2 * i] = ((float)(i % SIZE) + 0.5f) / SIZE;
        x[2 * i + 1] = ((float)(i / SIZE) + 0.5f) / SIZE;
    }
    if (tinn_model_infer(m, x, NULL, n, y) != 0) { fprintf(stderr, "%s\n", tinn_model_last_error()); return 1; }
    if (repeats > 0) {
        double *times = (double *)malloc(sizeof(double) * (size_t)repeats);
        for (i = 0; i < repeats; i++) {
            double t0 = now();
            if (tinn_model_infer(m, x, NULL, n, y) != 0) { fprintf(stderr, "%s\n", tinn_model_last_error()); return 1; }
            times[i] = now() - t0;
        }
        qsort(times, (size_t)repeats, sizeof(double), by_value);
        printf("inference of %d x %d: median %.6f s over %d runs (%.2f M samples/s)\n", SIZE, SIZE,
               times[repeats / 2], repeats, n / times[repeats / 2] * 1e-6);
        free(times);
    }
    out = fopen(argv[2], "wb");
    if (!out) { fprintf(stderr, "cannot write %s\n", argv[2]); return 1; }
    fprintf(out, "P6\n%d %d\n255\n", SIZE, SIZE);
    for (i = 0; i < 3 * n; i++) {
        float v = y[i] < 0.0f ? 0.0f : y[i] > 1.0f ? 1.0f : y[i];
        fputc((int)(v * 255.0f + 0.5f), out);
    }
    fclose(out);
    tinn_model_close(m);
    free(x);
    free(y);
    printf("wrote %s\n", argv[2]);
    return 0;
}
