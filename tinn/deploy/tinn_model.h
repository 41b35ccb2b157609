/* tinn_model.h: run a model exported by tinn.deploy.export from C or C++, without Python.

   Header only, on top of the Taichi C API (taichi/_lib/c_api/ in the taichi wheel). Build with

       cc my_program.c $(python -m tinn.deploy --cflags --libs)

   and nothing else. Use:

       tinn_model *m = tinn_model_open("folder", "vulkan");       // NULL on error
       if (!m) { fprintf(stderr, "%s\n", tinn_model_last_error()); return 1; }
       // x: n rows of tinn_model_n_inputs(m) floats; y: n rows of tinn_model_n_outputs(m) floats (row-major)
       if (tinn_model_infer(m, x, NULL, n, y) != 0) fprintf(stderr, "%s\n", tinn_model_last_error());
       tinn_model_close(m);

   ids (int32, one per row, in [0, tinn_model_n_instances(m))) pick each row's network of an array; pass NULL
   for a single network. Every function checks its arguments and the folder's files and returns NULL or non-zero
   with a message (tinn_model_last_error) instead of crashing. The last error is per thread where the compiler
   offers thread-local storage (GCC, Clang, MSVC); a tinn_model is for one thread at a time. */
#ifndef TINN_MODEL_H
#define TINN_MODEL_H

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <taichi/taichi_core.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TINN_MODEL_FORMAT_VERSION 1     /* model.json's "format_version" this header reads */

typedef struct tinn_model {
    TiRuntime runtime;
    TiAotModule module;
    TiKernel kernel;
    TiMemory params, x, ids, y;         /* x, ids, y: grown to the largest batch seen */
    int32_t n_inputs, n_outputs, n_instances, n_params, routed;
    int64_t capacity;                   /* rows that x, ids and y hold */
} tinn_model;

#if defined(__GNUC__) || defined(__clang__)
#define TINN__THREAD_LOCAL __thread
#elif defined(_MSC_VER)
#define TINN__THREAD_LOCAL __declspec(thread)
#else
#define TINN__THREAD_LOCAL
#endif

static inline char *tinn__error_buffer(void) {
    static TINN__THREAD_LOCAL char message[1024];
    return message;
}

/* The message of the last failed call on this thread ("" if none failed). */
static inline const char *tinn_model_last_error(void) { return tinn__error_buffer(); }

static inline void tinn__fail(const char *what, const char *detail) {
    snprintf(tinn__error_buffer(), 1024, "tinn_model: %s%s%s", what, detail && *detail ? ": " : "",
             detail ? detail : "");
}

/* 1 and a message naming `what` if the Taichi C API reported an error since it was last cleared. */
static inline int tinn__taichi_failed(const char *what) {
    char message[512];
    uint64_t size = sizeof(message);
    TiError error;
    message[0] = '\0';
    error = ti_get_last_error(&size, message);
    if (error == TI_ERROR_SUCCESS) return 0;
    message[sizeof(message) - 1] = '\0';
    tinn__fail(what, message[0] ? message : "the Taichi C API reported an error");
    ti_set_last_error(TI_ERROR_SUCCESS, NULL);
    return 1;
}

/* 1 and a message if `handle` is NULL or the Taichi C API reported an error (its message, after `what`). */
static inline int tinn__check(const void *handle, const char *what) {
    if (tinn__taichi_failed(what)) return 1;
    if (!handle) { tinn__fail(what, NULL); return 1; }
    return 0;
}

/* The whole file (NUL-terminated) and its size, or NULL. */
static inline char *tinn__read_file(const char *folder, const char *name, long max_size, long *size) {
    char path[4096];
    FILE *f;
    char *data;
    long n;
    snprintf(path, sizeof(path), "%s/%s", folder, name);
    f = fopen(path, "rb");
    if (!f) { tinn__fail("cannot open", path); return NULL; }
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f); tinn__fail("cannot read", path); return NULL;
    }
    if (n > max_size) { fclose(f); tinn__fail("file too large", path); return NULL; }
    data = (char *)malloc((size_t)n + 1);
    if (!data) { fclose(f); tinn__fail("out of memory reading", path); return NULL; }
    if (fread(data, 1, (size_t)n, f) != (size_t)n) { free(data); fclose(f); tinn__fail("cannot read", path); return NULL; }
    fclose(f);
    data[n] = '\0';
    *size = n;
    return data;
}

/* The value of "key" in the flat JSON object `json`: its first character, or NULL. */
static inline const char *tinn__json_value(const char *json, const char *key) {
    char quoted[64];
    const char *p;
    snprintf(quoted, sizeof(quoted), "\"%s\"", key);
    p = strstr(json, quoted);
    if (!p) return NULL;
    p += strlen(quoted);
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    if (*p != ':') return NULL;
    p++;
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    return p;
}

static inline int tinn__json_int(const char *json, const char *key, int64_t lo, int64_t hi, int64_t *out) {
    const char *p = tinn__json_value(json, key);
    char *end;
    long long v;
    if (!p) { tinn__fail("model.json lacks the integer key", key); return 1; }
    v = strtoll(p, &end, 10);
    if (end == p || v < lo || v > hi) { tinn__fail("model.json has a bad value for the key", key); return 1; }
    *out = (int64_t)v;
    return 0;
}

static inline int tinn__json_string(const char *json, const char *key, char *out, size_t size) {
    const char *p = tinn__json_value(json, key);
    size_t n = 0;
    if (!p || *p != '"') { tinn__fail("model.json lacks the string key", key); return 1; }
    for (p++; *p && *p != '"'; p++) {
        if (n + 1 >= size || *p == '\\') { tinn__fail("model.json has a bad value for the key", key); return 1; }
        out[n++] = *p;
    }
    if (*p != '"') { tinn__fail("model.json has a bad value for the key", key); return 1; }
    out[n] = '\0';
    return 0;
}

/* The Taichi arch of `name`: "vulkan", the one arch tinn exports (TI_ARCH_RESERVED for any other). */
static inline TiArch tinn__arch(const char *name) {
    return name && !strcmp(name, "vulkan") ? TI_ARCH_VULKAN : TI_ARCH_RESERVED;
}

static inline TiMemory tinn__allocate(TiRuntime runtime, uint64_t bytes) {
    TiMemoryAllocateInfo info;
    memset(&info, 0, sizeof(info));
    info.size = bytes ? bytes : 4;
    info.host_write = TI_TRUE;
    info.host_read = TI_TRUE;
    info.usage = TI_MEMORY_USAGE_STORAGE_BIT;
    return ti_allocate_memory(runtime, &info);
}

static inline int tinn__upload(TiRuntime runtime, TiMemory memory, const void *data, size_t bytes) {
    void *p = ti_map_memory(runtime, memory);
    if (!p || tinn__taichi_failed("cannot map device memory")) return 1;
    memcpy(p, data, bytes);
    ti_unmap_memory(runtime, memory);
    return tinn__taichi_failed("cannot unmap device memory");
}

/* Release everything `m` holds (any member may be unset) and `m` itself. */
static inline void tinn_model_close(tinn_model *m) {
    if (!m) return;
    if (m->runtime) {
        if (m->x) ti_free_memory(m->runtime, m->x);
        if (m->ids) ti_free_memory(m->runtime, m->ids);
        if (m->y) ti_free_memory(m->runtime, m->y);
        if (m->params) ti_free_memory(m->runtime, m->params);
        if (m->module) ti_destroy_aot_module(m->module);
        ti_destroy_runtime(m->runtime);
        ti_set_last_error(TI_ERROR_SUCCESS, NULL);
    }
    free(m);
}

/* Load the model exported to `folder` (model.json, model.tcm, params.bin) on `arch` ("vulkan"; the export's
   arch). NULL and a message if a file is missing or corrupt, the export is of another format, Taichi version or
   arch, or the machine has no device of that arch. */
static inline tinn_model *tinn_model_open(const char *folder, const char *arch) {
    tinn_model *m;
    char *json, *tcm = NULL, *params = NULL, text[64];
    long json_size, tcm_size, params_size;
    int64_t format, n_inputs, n_outputs, n_instances, n_params, routed;
    unsigned major = 0, minor = 0, patch = 0;
    uint32_t version = ti_get_version();
    TiArch ti_arch = tinn__arch(arch);

    ti_set_last_error(TI_ERROR_SUCCESS, NULL);
    if (!folder) { tinn__fail("tinn_model_open: folder is NULL", NULL); return NULL; }
    if (ti_arch == TI_ARCH_RESERVED) {
        tinn__fail("unsupported arch (tinn.deploy exports run on \"vulkan\" only)", arch ? arch : "NULL");
        return NULL;
    }
    if (!(json = tinn__read_file(folder, "model.json", 1 << 20, &json_size))) return NULL;
    if (tinn__json_string(json, "format", text, sizeof(text)) || strcmp(text, "tinn-deploy") != 0) {
        tinn__fail("not a tinn.deploy export (model.json's \"format\" is not \"tinn-deploy\")", folder);
        free(json); return NULL;
    }
    if (tinn__json_int(json, "format_version", 0, 1 << 30, &format)) { free(json); return NULL; }
    if (format != TINN_MODEL_FORMAT_VERSION) {
        char detail[128];
        snprintf(detail, sizeof(detail), "model.json has format_version %lld, this tinn_model.h reads %d",
                 (long long)format, TINN_MODEL_FORMAT_VERSION);
        tinn__fail("version mismatch", detail);
        free(json); return NULL;
    }
    if (tinn__json_string(json, "taichi_version", text, sizeof(text)) ||
        sscanf(text, "%u.%u.%u", &major, &minor, &patch) != 3) {
        tinn__fail("model.json has a bad value for the key", "taichi_version"); free(json); return NULL;
    }
    if (major != version / 1000000 || minor != version / 1000 % 1000) {
        char detail[256];
        snprintf(detail, sizeof(detail), "exported with Taichi %s, the Taichi C API loaded is %u.%u (export again "
                 "with the taichi that ships this libtaichi_c_api)", text, version / 1000000, version / 1000 % 1000);
        tinn__fail("version mismatch", detail);
        free(json); return NULL;
    }
    if (tinn__json_string(json, "arch", text, sizeof(text))) { free(json); return NULL; }
    if (strcmp(text, arch) != 0) {
        char detail[256];
        snprintf(detail, sizeof(detail), "the module was compiled for %s, asked to run on %s", text, arch);
        tinn__fail("arch mismatch", detail);
        free(json); return NULL;
    }
    if (tinn__json_int(json, "n_inputs", 1, 1 << 20, &n_inputs) || tinn__json_int(json, "n_outputs", 1, 1 << 20, &n_outputs) ||
        tinn__json_int(json, "n_instances", 1, INT32_MAX, &n_instances) ||
        tinn__json_int(json, "n_params", 0, INT32_MAX, &n_params) || tinn__json_int(json, "routed", 0, 1, &routed)) {
        free(json); return NULL;
    }
    free(json);
    if (!(params = tinn__read_file(folder, "params.bin", LONG_MAX - 1, &params_size))) return NULL;
    if ((int64_t)params_size != n_instances * (n_params ? n_params : 1) * 4) {
        char detail[256];
        snprintf(detail, sizeof(detail), "params.bin holds %ld bytes, model.json asks for %lld x %lld float32",
                 params_size, (long long)n_instances, (long long)(n_params ? n_params : 1));
        tinn__fail("corrupt export", detail);
        free(params); return NULL;
    }
    if (!(tcm = tinn__read_file(folder, "model.tcm", LONG_MAX - 1, &tcm_size))) { free(params); return NULL; }
    if (tcm_size < 4 || memcmp(tcm, "PK", 2) != 0) {
        tinn__fail("corrupt export: model.tcm is not a Taichi AOT archive", folder);
        free(params); free(tcm); return NULL;
    }

    m = (tinn_model *)calloc(1, sizeof(tinn_model));
    if (!m) { tinn__fail("out of memory", NULL); free(params); free(tcm); return NULL; }
    m->n_inputs = (int32_t)n_inputs; m->n_outputs = (int32_t)n_outputs; m->n_instances = (int32_t)n_instances;
    m->n_params = (int32_t)n_params; m->routed = (int32_t)routed;
    m->runtime = ti_create_runtime(ti_arch, 0);
    if (tinn__check(m->runtime, "cannot create a Taichi runtime (no device of this arch, or its driver failed)")) {
        m->runtime = TI_NULL_HANDLE; goto fail;
    }
    m->module = ti_create_aot_module(m->runtime, tcm, (uint64_t)tcm_size);
    if (tinn__check(m->module, "cannot load model.tcm")) { m->module = TI_NULL_HANDLE; goto fail; }
    m->kernel = ti_get_aot_module_kernel(m->module, "tinn_infer");
    if (tinn__check(m->kernel, "model.tcm has no kernel tinn_infer")) goto fail;
    m->params = tinn__allocate(m->runtime, (uint64_t)params_size);
    if (tinn__check(m->params, "cannot allocate the parameters")) { m->params = TI_NULL_HANDLE; goto fail; }
    if (tinn__upload(m->runtime, m->params, params, (size_t)params_size)) goto fail;
    free(params); free(tcm);
    return m;
fail:
    free(params); free(tcm);
    {
        char keep[1024];
        memcpy(keep, tinn__error_buffer(), sizeof(keep));
        tinn_model_close(m);
        memcpy(tinn__error_buffer(), keep, sizeof(keep));
    }
    return NULL;
}

static inline int32_t tinn_model_n_inputs(const tinn_model *m) { return m ? m->n_inputs : 0; }
static inline int32_t tinn_model_n_outputs(const tinn_model *m) { return m ? m->n_outputs : 0; }
/* The networks of an array (1 for a single network); ids index them. */
static inline int32_t tinn_model_n_instances(const tinn_model *m) { return m ? m->n_instances : 0; }

static inline TiArgument tinn__ndarray(TiMemory memory, uint32_t rows, uint32_t cols, TiDataType type) {
    TiArgument a;
    memset(&a, 0, sizeof(a));
    a.type = TI_ARGUMENT_TYPE_NDARRAY;
    a.value.ndarray.memory = memory;
    a.value.ndarray.shape.dim_count = cols ? 2 : 1;
    a.value.ndarray.shape.dims[0] = rows;
    a.value.ndarray.shape.dims[1] = cols;
    a.value.ndarray.elem_type = type;
    return a;
}

/* y = model(x): x is (n, n_inputs) and y (n, n_outputs) float32, row-major; ids is (n,) int32 in
   [0, n_instances) for a network array (routed export), NULL otherwise. 0 on success, else non-zero and a
   message (nothing is written to y). */
static inline int tinn_model_infer(tinn_model *m, const float *x, const int32_t *ids, int32_t n, float *y) {
    TiArgument args[4];
    uint32_t n_args = 0;
    void *p;
    int32_t i;
    if (!m || !m->runtime) { tinn__fail("tinn_model_infer: the model is NULL", NULL); return 1; }
    if (n < 0) { tinn__fail("tinn_model_infer: n must be at least 0", NULL); return 1; }
    if ((int64_t)n * (m->n_inputs > m->n_outputs ? m->n_inputs : m->n_outputs) > INT32_MAX) {
        tinn__fail("tinn_model_infer: n is too large (n times the input or output width must stay below 2^31)", NULL);
        return 1;
    }
    if (n == 0) return 0;
    if (!x || !y) { tinn__fail("tinn_model_infer: x and y must not be NULL", NULL); return 1; }
    if (m->routed && !ids) { tinn__fail("tinn_model_infer: a network array needs ids (one per row)", NULL); return 1; }
    if (!m->routed && ids) { tinn__fail("tinn_model_infer: ids must be NULL for a single network", NULL); return 1; }
    for (i = 0; ids && i < n; i++)
        if (ids[i] < 0 || ids[i] >= m->n_instances) {
            char detail[96];
            snprintf(detail, sizeof(detail), "ids[%d] = %d is not in [0, %d)", (int)i, (int)ids[i], (int)m->n_instances);
            tinn__fail("tinn_model_infer", detail);
            return 1;
        }
    ti_set_last_error(TI_ERROR_SUCCESS, NULL);
    if (n > m->capacity) {
        if (m->x) ti_free_memory(m->runtime, m->x);
        if (m->ids) ti_free_memory(m->runtime, m->ids);
        if (m->y) ti_free_memory(m->runtime, m->y);
        m->x = m->ids = m->y = TI_NULL_HANDLE;
        m->capacity = 0;
        m->x = tinn__allocate(m->runtime, (uint64_t)n * m->n_inputs * 4);
        m->y = tinn__allocate(m->runtime, (uint64_t)n * m->n_outputs * 4);
        if (m->routed) m->ids = tinn__allocate(m->runtime, (uint64_t)n * 4);
        if (tinn__check(m->x, "cannot allocate device memory") || tinn__check(m->y, "cannot allocate device memory") ||
            (m->routed && tinn__check(m->ids, "cannot allocate device memory")))
            return 1;
        m->capacity = n;
    }
    if (tinn__upload(m->runtime, m->x, x, (size_t)n * m->n_inputs * 4)) return 1;
    if (m->routed && tinn__upload(m->runtime, m->ids, ids, (size_t)n * 4)) return 1;
    args[n_args++] = tinn__ndarray(m->x, (uint32_t)n, (uint32_t)m->n_inputs, TI_DATA_TYPE_F32);
    if (m->routed) args[n_args++] = tinn__ndarray(m->ids, (uint32_t)n, 0, TI_DATA_TYPE_I32);
    args[n_args++] = tinn__ndarray(m->params, (uint32_t)m->n_instances, (uint32_t)(m->n_params ? m->n_params : 1),
                                   TI_DATA_TYPE_F32);
    args[n_args++] = tinn__ndarray(m->y, (uint32_t)n, (uint32_t)m->n_outputs, TI_DATA_TYPE_F32);
    ti_launch_kernel(m->runtime, m->kernel, n_args, args);
    if (tinn__taichi_failed("cannot launch the kernel")) return 1;
    ti_wait(m->runtime);
    if (tinn__taichi_failed("the kernel failed")) return 1;
    p = ti_map_memory(m->runtime, m->y);
    if (!p || tinn__taichi_failed("cannot map device memory")) return 1;
    memcpy(y, p, (size_t)n * m->n_outputs * 4);
    ti_unmap_memory(m->runtime, m->y);
    return tinn__taichi_failed("cannot unmap device memory");
}

#ifdef __cplusplus
}
#endif

#endif /* TINN_MODEL_H */
