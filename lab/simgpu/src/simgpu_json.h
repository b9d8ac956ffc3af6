/* A small JSON reader for the simulated GPU's description file: parse into a tree, look values up. */
#ifndef GPUFLEET_SIMGPU_JSON_H
#define GPUFLEET_SIMGPU_JSON_H

#include <stddef.h>

typedef enum {
    JSON_NULL,
    JSON_BOOL,
    JSON_NUMBER,
    JSON_STRING,
    JSON_ARRAY,
    JSON_OBJECT
} json_type;

typedef struct json_value {
    json_type type;
    int boolean;
    double number;
    char *string;                /* JSON_STRING: UTF-8, NUL-terminated */
    size_t count;                /* JSON_ARRAY / JSON_OBJECT: number of members */
    char **keys;                 /* JSON_OBJECT: member names, in file order */
    struct json_value **items;   /* JSON_ARRAY / JSON_OBJECT: member values */
} json_value;

/* Parses text; on failure returns NULL and writes "line N: what is wrong" into error. */
json_value *json_parse(const char *text, char *error, size_t error_size);

void json_free(json_value *value);

/* The member named key of an object, or NULL when absent or when object is not an object. */
const json_value *json_get(const json_value *object, const char *key);

const char *json_type_name(json_type type);

#endif
