/* The C side of bench_deploy.py: one inference of a SIZE x SIZE image's pixel centres per line read from stdin,
   its wall time in seconds printed (after one untimed warm-up, which compiles the kernel).

       cc benchmarks/deploy_infer.c -o deploy_infer $(python -m tinn.deploy --cflags --libs)
       ./deploy_infer MODEL_FOLDER SIZE < commands */
#define _POSIX_C_SOURCE 199309L
#include <tinn_model.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    int32_t size = argc > 2 ? (int32_t)atoi(argv[2]) : 512, n = size * size, i;
    char line[64];
    tinn_model *m = argc > 1 ? tinn_model_open(argv[1], "vulkan") : NULL;
    float *x, *y;
    if (!m) { printf("error %s\n", argc > 1 ? tinn_model_last_error() : "usage: deploy_infer FOLDER SIZE"); return 1; }
    x = (float *)malloc(sizeof(float) * 2 * (size_t)n);
    y = (float *)malloc(sizeof(float) * (size_t)tinn_model_n_outputs(m) * (size_t)n);
    for (i = 0; i < n; i++) {
        x[2 * i] = ((float)(i % size) + 0.5f) / (float)size;
        x[2 * i + 1] = ((float)(i / size) + 0.5f) / (float)size;
    }
    if (tinn_model_infer(m, x, NULL, n, y)) { printf("error %s\n", tinn_model_last_error()); return 1; }
    printf("ready\n");
    fflush(stdout);
    while (fgets(line, sizeof(line), stdin)) {
        double t0 = now();
        if (tinn_model_infer(m, x, NULL, n, y)) { printf("error %s\n", tinn_model_last_error()); return 1; }
        printf("%.6f %.6f\n", now() - t0, (double)y[0]);
        fflush(stdout);
    }
    tinn_model_close(m);
    return 0;
}
