/* Minimal JSON reader/writer (see json.h for why it exists). */
#include "json.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *p;
    const char *start;
    char *err;
    size_t errlen;
    int depth;
} parser;

static void set_err(parser *ps, const char *what)
{
    int line = 1, col = 1;
    for (const char *q = ps->start; q < ps->p; q++) {
        if (*q == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    if (ps->err && ps->errlen && !ps->err[0])
        snprintf(ps->err, ps->errlen, "line %d col %d: %s", line, col, what);
}

static js *new_val(js_type t)
{
    js *v = calloc(1, sizeof(*v));
    if (v)
        v->t = t;
    return v;
}

void js_free(js *v)
{
    if (!v)
        return;
    for (size_t i = 0; i < v->len; i++) {
        js_free(v->items[i]);
        if (v->keys)
            free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->s);
    free(v);
}

static void skip_ws(parser *ps)
{
    while (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')
        ps->p++;
}

static int push(js *v, char *key, js *item)
{
    if (v->len == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 8;
        js **items = realloc(v->items, cap * sizeof(*items));
        if (!items)
            return -1;
        v->items = items;
        if (v->t == JS_OBJ) {
            char **keys = realloc(v->keys, cap * sizeof(*keys));
            if (!keys)
                return -1;
            v->keys = keys;
        }
        v->cap = cap;
    }
    v->items[v->len] = item;
    if (v->t == JS_OBJ)
        v->keys[v->len] = key;
    v->len++;
    return 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static void put_utf8(char **o, unsigned cp)
{
    char *q = *o;
    if (cp < 0x80) {
        *q++ = (char)cp;
    } else if (cp < 0x800) {
        *q++ = (char)(0xC0 | (cp >> 6));
        *q++ = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        *q++ = (char)(0xE0 | (cp >> 12));
        *q++ = (char)(0x80 | ((cp >> 6) & 0x3F));
        *q++ = (char)(0x80 | (cp & 0x3F));
    } else {
        *q++ = (char)(0xF0 | (cp >> 18));
        *q++ = (char)(0x80 | ((cp >> 12) & 0x3F));
        *q++ = (char)(0x80 | ((cp >> 6) & 0x3F));
        *q++ = (char)(0x80 | (cp & 0x3F));
    }
    *o = q;
}

static int read_hex4(parser *ps, unsigned *out)
{
    unsigned cp = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(ps->p[i]);
        if (h < 0) {
            set_err(ps, "bad \\u escape");
            return -1;
        }
        cp = cp * 16 + (unsigned)h;
    }
    ps->p += 4;
    *out = cp;
    return 0;
}

static char *parse_string_raw(parser *ps)
{
    /* ps->p points at the opening quote. Output is never longer than the input. */
    const char *q = ps->p + 1;
    size_t maxlen = 0;
    while (q[maxlen] && q[maxlen] != '"') {
        if (q[maxlen] == '\\' && q[maxlen + 1])
            maxlen++;
        maxlen++;
    }
    char *out = malloc(maxlen + 4);
    if (!out) {
        set_err(ps, "out of memory");
        return NULL;
    }
    char *o = out;
    ps->p++;
    for (;;) {
        char c = *ps->p;
        if (c == '\0') {
            set_err(ps, "unterminated string");
            free(out);
            return NULL;
        }
        if ((unsigned char)c < 0x20) {
            set_err(ps, "control character in string");
            free(out);
            return NULL;
        }
        ps->p++;
        if (c == '"')
            break;
        if (c != '\\') {
            *o++ = c;
            continue;
        }
        char e = *ps->p++;
        switch (e) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '/': *o++ = '/'; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'u': {
            unsigned cp;
            if (read_hex4(ps, &cp)) {
                free(out);
                return NULL;
            }
            if (cp >= 0xD800 && cp < 0xDC00 && ps->p[0] == '\\' && ps->p[1] == 'u') {
                unsigned lo;
                ps->p += 2;
                if (read_hex4(ps, &lo)) {
                    free(out);
                    return NULL;
                }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            put_utf8(&o, cp);
            break;
        }
        default:
            ps->p--;
            set_err(ps, "bad escape in string");
            free(out);
            return NULL;
        }
    }
    *o = '\0';
    return out;
}

static js *parse_value(parser *ps);

static js *parse_container(parser *ps, js_type t)
{
    char close = t == JS_OBJ ? '}' : ']';
    js *v = new_val(t);
    if (!v) {
        set_err(ps, "out of memory");
        return NULL;
    }
    if (++ps->depth > 64) {
        set_err(ps, "nesting too deep");
        js_free(v);
        return NULL;
    }
    ps->p++;
    skip_ws(ps);
    if (*ps->p == close) {
        ps->p++;
        ps->depth--;
        return v;
    }
    for (;;) {
        char *key = NULL;
        skip_ws(ps);
        if (t == JS_OBJ) {
            if (*ps->p != '"') {
                set_err(ps, "expected a string key");
                js_free(v);
                return NULL;
            }
            key = parse_string_raw(ps);
            if (!key) {
                js_free(v);
                return NULL;
            }
            skip_ws(ps);
            if (*ps->p != ':') {
                set_err(ps, "expected ':' after key");
                free(key);
                js_free(v);
                return NULL;
            }
            ps->p++;
        }
        js *item = parse_value(ps);
        if (!item || push(v, key, item)) {
            if (item)
                set_err(ps, "out of memory");
            js_free(item);
            free(key);
            js_free(v);
            return NULL;
        }
        skip_ws(ps);
        if (*ps->p == ',') {
            ps->p++;
            continue;
        }
        if (*ps->p == close) {
            ps->p++;
            ps->depth--;
            return v;
        }
        set_err(ps, t == JS_OBJ ? "expected ',' or '}'" : "expected ',' or ']'");
        js_free(v);
        return NULL;
    }
}

static js *parse_value(parser *ps)
{
    skip_ws(ps);
    char c = *ps->p;
    if (c == '{')
        return parse_container(ps, JS_OBJ);
    if (c == '[')
        return parse_container(ps, JS_ARR);
    if (c == '"') {
        char *s = parse_string_raw(ps);
        if (!s)
            return NULL;
        js *v = new_val(JS_STR);
        if (!v) {
            free(s);
            set_err(ps, "out of memory");
            return NULL;
        }
        v->s = s;
        return v;
    }
    if (!strncmp(ps->p, "true", 4) || !strncmp(ps->p, "false", 5)) {
        js *v = new_val(JS_BOOL);
        if (!v)
            return NULL;
        v->b = c == 't';
        ps->p += v->b ? 4 : 5;
        return v;
    }
    if (!strncmp(ps->p, "null", 4)) {
        ps->p += 4;
        return new_val(JS_NULL);
    }
    if (c == '-' || isdigit((unsigned char)c)) {
        const char *s = ps->p;
        char *end;
        errno = 0;
        double d = strtod(s, &end);
        if (end == s) {
            set_err(ps, "bad number");
            return NULL;
        }
        js *v = new_val(JS_NUM);
        if (!v)
            return NULL;
        v->n = d;
        v->s = strndup(s, (size_t)(end - s));
        ps->p = end;
        return v;
    }
    set_err(ps, c ? "unexpected character" : "unexpected end of input");
    return NULL;
}

js *js_parse(const char *text, char *err, size_t errlen)
{
    parser ps = {text, text, err, errlen, 0};
    if (err && errlen)
        err[0] = '\0';
    js *v = parse_value(&ps);
    if (!v)
        return NULL;
    skip_ws(&ps);
    if (*ps.p) {
        set_err(&ps, "trailing characters after the JSON value");
        js_free(v);
        return NULL;
    }
    return v;
}

js *js_get(const js *obj, const char *key)
{
    if (!obj || obj->t != JS_OBJ)
        return NULL;
    for (size_t i = 0; i < obj->len; i++)
        if (!strcmp(obj->keys[i], key))
            return obj->items[i];
    return NULL;
}

js *js_at(const js *arr, size_t i)
{
    if (!arr || arr->t != JS_ARR || i >= arr->len)
        return NULL;
    return arr->items[i];
}

size_t js_len(const js *v)
{
    return (v && (v->t == JS_ARR || v->t == JS_OBJ)) ? v->len : 0;
}

long long js_int(const js *v, long long dflt)
{
    if (!v || v->t != JS_NUM)
        return dflt;
    char *end;
    long long x = strtoll(v->s, &end, 10);
    if (*end == '\0')
        return x;
    return (long long)v->n;
}

double js_num(const js *v, double dflt)
{
    return (v && v->t == JS_NUM) ? v->n : dflt;
}

const char *js_str(const js *v, const char *dflt)
{
    return (v && v->t == JS_STR) ? v->s : dflt;
}

int js_bool(const js *v, int dflt)
{
    if (!v)
        return dflt;
    if (v->t == JS_BOOL)
        return v->b;
    if (v->t == JS_NUM)
        return v->n != 0;
    return dflt;
}

int js_is_null(const js *v)
{
    return !v || v->t == JS_NULL;
}

int js_set_int(js *obj, const char *key, long long value)
{
    if (!obj || obj->t != JS_OBJ)
        return -1;
    char buf[32];
    snprintf(buf, sizeof(buf), "%lld", value);
    js *v = js_get(obj, key);
    if (v) {
        if (v->t == JS_ARR || v->t == JS_OBJ)
            return -1;
        free(v->s);
        v->t = JS_NUM;
        v->n = (double)value;
        v->s = strdup(buf);
        return v->s ? 0 : -1;
    }
    v = new_val(JS_NUM);
    char *k = strdup(key);
    if (!v || !k || !(v->s = strdup(buf)) || push(obj, k, v)) {
        js_free(v);
        free(k);
        return -1;
    }
    v->n = (double)value;
    return 0;
}

js *js_new_obj(void)
{
    return new_val(JS_OBJ);
}

js *js_new_arr(void)
{
    return new_val(JS_ARR);
}

js *js_new_int(long long value)
{
    char buf[32];
    snprintf(buf, sizeof(buf), "%lld", value);
    js *v = new_val(JS_NUM);
    if (v && !(v->s = strdup(buf))) {
        js_free(v);
        return NULL;
    }
    if (v)
        v->n = (double)value;
    return v;
}

js *js_new_str(const char *s)
{
    js *v = new_val(JS_STR);
    if (v && !(v->s = strdup(s ? s : ""))) {
        js_free(v);
        return NULL;
    }
    return v;
}

int js_obj_put(js *obj, const char *key, js *value)
{
    if (!obj || obj->t != JS_OBJ || !value)
        return -1;
    for (size_t i = 0; i < obj->len; i++) {
        if (!strcmp(obj->keys[i], key)) {
            js_free(obj->items[i]);
            obj->items[i] = value;
            return 0;
        }
    }
    char *k = strdup(key);
    if (!k || push(obj, k, value)) {
        free(k);
        return -1;
    }
    return 0;
}

int js_arr_push(js *arr, js *value)
{
    if (!arr || arr->t != JS_ARR || !value)
        return -1;
    return push(arr, NULL, value);
}

void js_arr_remove(js *arr, size_t i)
{
    if (!arr || arr->t != JS_ARR || i >= arr->len)
        return;
    js_free(arr->items[i]);
    memmove(&arr->items[i], &arr->items[i + 1], (arr->len - i - 1) * sizeof(arr->items[0]));
    arr->len--;
}

static void dump_str(const char *s, FILE *out)
{
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': fputs("\\\"", out); break;
        case '\\': fputs("\\\\", out); break;
        case '\n': fputs("\\n", out); break;
        case '\r': fputs("\\r", out); break;
        case '\t': fputs("\\t", out); break;
        default:
            if (*p < 0x20)
                fprintf(out, "\\u%04x", *p);
            else
                fputc(*p, out);
        }
    }
    fputc('"', out);
}

static void dump_at(const js *v, FILE *out, int indent)
{
    switch (v->t) {
    case JS_NULL: fputs("null", out); return;
    case JS_BOOL: fputs(v->b ? "true" : "false", out); return;
    case JS_NUM: fputs(v->s, out); return;
    case JS_STR: dump_str(v->s, out); return;
    case JS_ARR:
    case JS_OBJ:
        break;
    }
    char open = v->t == JS_OBJ ? '{' : '[', close = v->t == JS_OBJ ? '}' : ']';
    if (v->len == 0) {
        fprintf(out, "%c%c", open, close);
        return;
    }
    fprintf(out, "%c\n", open);
    for (size_t i = 0; i < v->len; i++) {
        fprintf(out, "%*s", indent + 2, "");
        if (v->t == JS_OBJ) {
            dump_str(v->keys[i], out);
            fputs(": ", out);
        }
        dump_at(v->items[i], out, indent + 2);
        fputs(i + 1 < v->len ? ",\n" : "\n", out);
    }
    fprintf(out, "%*s%c", indent, "", close);
}

int js_dump(const js *v, FILE *out)
{
    dump_at(v, out, 0);
    fputc('\n', out);
    return ferror(out) ? -1 : 0;
}
