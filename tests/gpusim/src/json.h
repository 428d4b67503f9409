/*
 * Minimal JSON reader/writer for gpusim's state file.
 *
 * Why hand-written: the simulated libnvidia-ml.so.1 is copied into minimal Debian containers
 * (molecule tests) where no JSON library is installed, so it must not depend on one. The state file
 * is small (tens of KiB) and written by our own tools, so a simple recursive-descent parser is enough.
 */
#ifndef GPUSIM_JSON_H
#define GPUSIM_JSON_H

#include <stddef.h>
#include <stdio.h>

typedef enum { JS_NULL, JS_BOOL, JS_NUM, JS_STR, JS_ARR, JS_OBJ } js_type;

typedef struct js {
    js_type t;
    int b;              /* JS_BOOL */
    double n;           /* JS_NUM */
    char *s;            /* JS_STR value, or JS_NUM lexeme (kept to write numbers back unchanged) */
    size_t len;         /* items in JS_ARR / JS_OBJ */
    size_t cap;
    struct js **items;  /* JS_ARR / JS_OBJ values */
    char **keys;        /* JS_OBJ keys */
} js;

/* Parse text; on error returns NULL and writes "line L col C: what" into err. */
js *js_parse(const char *text, char *err, size_t errlen);
void js_free(js *v);

js *js_get(const js *obj, const char *key);   /* NULL when absent or obj not an object */
js *js_at(const js *arr, size_t i);           /* NULL when out of range or not an array */
size_t js_len(const js *v);                   /* 0 unless array/object */
long long js_int(const js *v, long long dflt);
double js_num(const js *v, double dflt);
const char *js_str(const js *v, const char *dflt);
int js_bool(const js *v, int dflt);           /* bool, or number != 0 */
int js_is_null(const js *v);                  /* absent or null */

/* Replace (or add) an integer member of an object. Returns 0 on success. */
int js_set_int(js *obj, const char *key, long long value);

/* Builders for nvmlDeviceCreateGpuInstanceWithPlacement & co, which edit the state tree. New values are
 * owned by the caller until attached with js_obj_put / js_arr_push (then by the container). */
js *js_new_obj(void);
js *js_new_arr(void);
js *js_new_int(long long value);
js *js_new_str(const char *s);
int js_obj_put(js *obj, const char *key, js *value); /* replaces an existing member; 0 on success */
int js_arr_push(js *arr, js *value);                 /* 0 on success */
void js_arr_remove(js *arr, size_t i);               /* frees the removed value */

/* Write v as indented JSON. Returns 0 on success. */
int js_dump(const js *v, FILE *out);

#endif
