/* The C side of tests/test_deploy.py: runs an export through tinn_model.h, built with
   `python -m tinn.deploy --cflags --libs` alone.

   deploy_runner FOLDER ARCH N DIR          y = model(x): DIR/x.bin (N rows), DIR/ids.bin if present -> DIR/y.bin
   deploy_runner FOLDER ARCH N DIR misuse   every bad call of tinn_model_infer, one line each, then the good one

   Prints "open: <message>" and exits 2 if the model does not open, "infer: <message>" and 3 if inference fails. */
#include <tinn_model.h>

static void *read_all(const char *dir, const char *name, size_t bytes) {
    char path[4096];
    FILE *f;
    void *data;
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    if (!(f = fopen(path, "rb"))) return NULL;
    data = malloc(bytes ? bytes : 1);
    if (fread(data, 1, bytes, f) != bytes) { free(data); data = NULL; }
    fclose(f);
    return data;
}

static void report(const char *what, int rc) {
    printf("%s: %d %s\n", what, rc, tinn_model_last_error());
}

int main(int argc, char **argv) {
    tinn_model *m;
    int32_t n, *ids;
    float *x, *y;
    char path[4096];
    FILE *f;
    if (argc < 5) { fprintf(stderr, "usage: deploy_runner FOLDER ARCH N DIR [misuse]\n"); return 1; }
    n = (int32_t)atoi(argv[3]);
    m = tinn_model_open(argv[1], argv[2]);
    if (!m) { printf("open: %s\n", tinn_model_last_error()); return 2; }
    x = (float *)read_all(argv[4], "x.bin", (size_t)n * tinn_model_n_inputs(m) * sizeof(float));
    ids = (int32_t *)read_all(argv[4], "ids.bin", (size_t)n * sizeof(int32_t));
    y = (float *)calloc((size_t)n * tinn_model_n_outputs(m) + 1, sizeof(float));
    if (!x) { fprintf(stderr, "no x.bin\n"); return 1; }
    if (argc > 5 && !strcmp(argv[5], "misuse")) {
        int32_t bad = tinn_model_n_instances(m), *wrong = (int32_t *)calloc((size_t)n, sizeof(int32_t));
        report("negative n", tinn_model_infer(m, x, ids, -1, y));
        report("huge n", tinn_model_infer(m, x, ids, INT32_MAX, y));
        report("no model", tinn_model_infer(NULL, x, ids, n, y));
        report("no x", tinn_model_infer(m, NULL, ids, n, y));
        report("ids", tinn_model_infer(m, x, ids ? NULL : wrong, n, y));
        wrong[n - 1] = ids ? bad : 0;
        if (ids) report("id out of range", tinn_model_infer(m, x, wrong, n, y));
        free(wrong);
        report("zero rows", tinn_model_infer(m, x, ids, 0, y));
        report("no model's widths", tinn_model_n_inputs(NULL) + tinn_model_n_outputs(NULL));
    }
    if (tinn_model_infer(m, x, ids, n, y) != 0) { printf("infer: %s\n", tinn_model_last_error()); return 3; }
    snprintf(path, sizeof(path), "%s/y.bin", argv[4]);
    f = fopen(path, "wb");
    fwrite(y, sizeof(float), (size_t)n * tinn_model_n_outputs(m), f);
    fclose(f);
    tinn_model_close(m);
    tinn_model_close(NULL);
    free(x); free(y); free(ids);
    printf("ok\n");
    return 0;
}
