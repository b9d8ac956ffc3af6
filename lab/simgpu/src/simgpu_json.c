/* Recursive-descent JSON reader (RFC 8259) sized for small description files. */
#include "simgpu_json.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Deep enough for any sane description; stops a hostile file from exhausting the stack. */
#define JSON_MAX_DEPTH 64

typedef struct {
    const char *text;
    size_t pos;
    int line;
    char *error;
    size_t error_size;
    int failed;
} parser;

static json_value *parse_value(parser *p, int depth);

static void fail(parser *p, const char *format, ...) {
    if (p->failed) {
        return;
    }
    p->failed = 1;
    int written = snprintf(p->error, p->error_size, "line %d: ", p->line);
    if (written < 0 || (size_t)written >= p->error_size) {
        return;
    }
    va_list args;
    va_start(args, format);
    vsnprintf(p->error + written, p->error_size - (size_t)written, format, args);
    va_end(args);
}

static void skip_whitespace(parser *p) {
    for (;;) {
        char c = p->text[p->pos];
        if (c == '\n') {
            p->line++;
        } else if (c != ' ' && c != '\t' && c != '\r') {
            return;
        }
        p->pos++;
    }
}

static json_value *new_value(parser *p, json_type type) {
    json_value *value = calloc(1, sizeof(*value));
    if (value == NULL) {
        fail(p, "out of memory");
        return NULL;
    }
    value->type = type;
    return value;
}

static int append_member(parser *p, json_value *container, char *key, json_value *item) {
    size_t n = container->count + 1;
    json_value **items = realloc(container->items, n * sizeof(*items));
    if (items == NULL) {
        fail(p, "out of memory");
        return 0;
    }
    container->items = items;
    if (container->type == JSON_OBJECT) {
        char **keys = realloc(container->keys, n * sizeof(*keys));
        if (keys == NULL) {
            fail(p, "out of memory");
            return 0;
        }
        container->keys = keys;
        keys[n - 1] = key;
    }
    items[n - 1] = item;
    container->count = n;
    return 1;
}

static int match_literal(parser *p, const char *word) {
    size_t len = strlen(word);
    if (strncmp(p->text + p->pos, word, len) != 0) {
        return 0;
    }
    p->pos += len;
    return 1;
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Reads the 4 hex digits of a \u escape; returns the code unit or -1. */
static long read_hex4(parser *p) {
    long code = 0;
    for (int i = 0; i < 4; i++) {
        int digit = hex_digit(p->text[p->pos + (size_t)i]);
        if (digit < 0) {
            fail(p, "bad \\u escape in string");
            return -1;
        }
        code = code * 16 + digit;
    }
    p->pos += 4;
    return code;
}

static size_t encode_utf8(unsigned long code, char *out) {
    if (code < 0x80) {
        out[0] = (char)code;
        return 1;
    }
    if (code < 0x800) {
        out[0] = (char)(0xC0 | (code >> 6));
        out[1] = (char)(0x80 | (code & 0x3F));
        return 2;
    }
    if (code < 0x10000) {
        out[0] = (char)(0xE0 | (code >> 12));
        out[1] = (char)(0x80 | ((code >> 6) & 0x3F));
        out[2] = (char)(0x80 | (code & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (code >> 18));
    out[1] = (char)(0x80 | ((code >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((code >> 6) & 0x3F));
    out[3] = (char)(0x80 | (code & 0x3F));
    return 4;
}

/* Decodes a \u escape (with its surrogate pair, if any) into out; returns bytes written or 0. */
static size_t read_unicode_escape(parser *p, char *out) {
    long code = read_hex4(p);
    if (code < 0) {
        return 0;
    }
    if (code >= 0xD800 && code <= 0xDBFF) {
        if (p->text[p->pos] != '\\' || p->text[p->pos + 1] != 'u') {
            fail(p, "unpaired surrogate in \\u escape");
            return 0;
        }
        p->pos += 2;
        long low = read_hex4(p);
        if (low < 0xDC00 || low > 0xDFFF) {
            fail(p, "unpaired surrogate in \\u escape");
            return 0;
        }
        code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
    }
    return encode_utf8((unsigned long)code, out);
}

/* Parses a string literal starting at the opening quote; returns a malloc'd UTF-8 copy. */
static char *parse_string_literal(parser *p) {
    p->pos++; /* opening quote */
    size_t capacity = 32, length = 0;
    char *out = malloc(capacity);
    if (out == NULL) {
        fail(p, "out of memory");
        return NULL;
    }
    for (;;) {
        if (capacity - length < 8) {
            capacity *= 2;
            char *grown = realloc(out, capacity);
            if (grown == NULL) {
                free(out);
                fail(p, "out of memory");
                return NULL;
            }
            out = grown;
        }
        unsigned char c = (unsigned char)p->text[p->pos];
        if (c == '\0') {
            fail(p, "unterminated string");
            break;
        }
        if (c < 0x20) {
            fail(p, "control character inside a string (escape it)");
            break;
        }
        p->pos++;
        if (c == '"') {
            out[length] = '\0';
            return out;
        }
        if (c != '\\') {
            out[length++] = (char)c;
            continue;
        }
        char escape = p->text[p->pos++];
        switch (escape) {
        case '"': out[length++] = '"'; break;
        case '\\': out[length++] = '\\'; break;
        case '/': out[length++] = '/'; break;
        case 'b': out[length++] = '\b'; break;
        case 'f': out[length++] = '\f'; break;
        case 'n': out[length++] = '\n'; break;
        case 'r': out[length++] = '\r'; break;
        case 't': out[length++] = '\t'; break;
        case 'u': {
            size_t written = read_unicode_escape(p, out + length);
            if (written == 0) {
                free(out);
                return NULL;
            }
            length += written;
            break;
        }
        default:
            fail(p, "unknown escape \\%c in string", escape);
            free(out);
            return NULL;
        }
    }
    free(out);
    return NULL;
}

static json_value *parse_number(parser *p) {
    const char *start = p->text + p->pos;
    char *end = NULL;
    /* strtod accepts more than JSON (hex, inf, leading '+'): check the first character ourselves. */
    if (!(*start == '-' || (*start >= '0' && *start <= '9'))) {
        fail(p, "unexpected character '%c'", *start);
        return NULL;
    }
    double number = strtod(start, &end);
    if (end == start) {
        fail(p, "bad number");
        return NULL;
    }
    json_value *value = new_value(p, JSON_NUMBER);
    if (value != NULL) {
        value->number = number;
        p->pos += (size_t)(end - start);
    }
    return value;
}

static json_value *parse_array(parser *p, int depth) {
    json_value *array = new_value(p, JSON_ARRAY);
    if (array == NULL) {
        return NULL;
    }
    p->pos++; /* '[' */
    skip_whitespace(p);
    if (p->text[p->pos] == ']') {
        p->pos++;
        return array;
    }
    for (;;) {
        json_value *item = parse_value(p, depth + 1);
        if (item == NULL || !append_member(p, array, NULL, item)) {
            json_free(item);
            json_free(array);
            return NULL;
        }
        skip_whitespace(p);
        char c = p->text[p->pos++];
        if (c == ']') {
            return array;
        }
        if (c != ',') {
            fail(p, "expected ',' or ']' in array");
            json_free(array);
            return NULL;
        }
    }
}

static json_value *parse_object(parser *p, int depth) {
    json_value *object = new_value(p, JSON_OBJECT);
    if (object == NULL) {
        return NULL;
    }
    p->pos++; /* '{' */
    skip_whitespace(p);
    if (p->text[p->pos] == '}') {
        p->pos++;
        return object;
    }
    for (;;) {
        skip_whitespace(p);
        if (p->text[p->pos] != '"') {
            fail(p, "expected a quoted member name");
            json_free(object);
            return NULL;
        }
        char *key = parse_string_literal(p);
        if (key == NULL) {
            json_free(object);
            return NULL;
        }
        if (json_get(object, key) != NULL) {
            fail(p, "duplicate member \"%s\"", key);
            free(key);
            json_free(object);
            return NULL;
        }
        skip_whitespace(p);
        if (p->text[p->pos++] != ':') {
            fail(p, "expected ':' after \"%s\"", key);
            free(key);
            json_free(object);
            return NULL;
        }
        json_value *item = parse_value(p, depth + 1);
        if (item == NULL || !append_member(p, object, key, item)) {
            free(key);
            json_free(item);
            json_free(object);
            return NULL;
        }
        skip_whitespace(p);
        char c = p->text[p->pos++];
        if (c == '}') {
            return object;
        }
        if (c != ',') {
            fail(p, "expected ',' or '}' in object");
            json_free(object);
            return NULL;
        }
    }
}

static json_value *parse_value(parser *p, int depth) {
    if (depth > JSON_MAX_DEPTH) {
        fail(p, "nested deeper than %d levels", JSON_MAX_DEPTH);
        return NULL;
    }
    skip_whitespace(p);
    char c = p->text[p->pos];
    switch (c) {
    case '{':
        return parse_object(p, depth);
    case '[':
        return parse_array(p, depth);
    case '"': {
        char *text = parse_string_literal(p);
        if (text == NULL) {
            return NULL;
        }
        json_value *value = new_value(p, JSON_STRING);
        if (value == NULL) {
            free(text);
            return NULL;
        }
        value->string = text;
        return value;
    }
    case '\0':
        fail(p, "unexpected end of file");
        return NULL;
    default:
        break;
    }
    if (match_literal(p, "true") || match_literal(p, "false")) {
        json_value *value = new_value(p, JSON_BOOL);
        if (value != NULL) {
            value->boolean = (c == 't');
        }
        return value;
    }
    if (match_literal(p, "null")) {
        return new_value(p, JSON_NULL);
    }
    return parse_number(p);
}

json_value *json_parse(const char *text, char *error, size_t error_size) {
    parser p = {text, 0, 1, error, error_size, 0};
    json_value *root = parse_value(&p, 0);
    if (root == NULL) {
        return NULL;
    }
    skip_whitespace(&p);
    if (p.text[p.pos] != '\0') {
        fail(&p, "unexpected text after the end of the document");
        json_free(root);
        return NULL;
    }
    return root;
}

void json_free(json_value *value) {
    if (value == NULL) {
        return;
    }
    for (size_t i = 0; i < value->count; i++) {
        json_free(value->items[i]);
        if (value->keys != NULL) {
            free(value->keys[i]);
        }
    }
    free(value->items);
    free(value->keys);
    free(value->string);
    free(value);
}

const json_value *json_get(const json_value *object, const char *key) {
    if (object == NULL || object->type != JSON_OBJECT) {
        return NULL;
    }
    for (size_t i = 0; i < object->count; i++) {
        if (strcmp(object->keys[i], key) == 0) {
            return object->items[i];
        }
    }
    return NULL;
}

const char *json_type_name(json_type type) {
    switch (type) {
    case JSON_NULL: return "null";
    case JSON_BOOL: return "a boolean";
    case JSON_NUMBER: return "a number";
    case JSON_STRING: return "a string";
    case JSON_ARRAY: return "an array";
    case JSON_OBJECT: return "an object";
    }
    return "unknown";
}
