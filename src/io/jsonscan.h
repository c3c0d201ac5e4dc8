/* The text of a JSONL line without building its JSON tree: a single pass that checks the line
 * is one JSON object (RFC 8259, UTF-8) and decodes only the string under a top-level key.
 * It answers only for lines it is sure of, so that its result is always the one jansson gives
 * (json_loadb with JSON_ALLOW_NUL, then json_object_get): anything unusual (a number with an
 * exponent or of many digits, an escape in a key, nesting deeper than 64, any error at all) is
 * left to jansson, which parses the line again and names the problem. */
#ifndef GJ_IO_JSONSCAN_H
#define GJ_IO_JSONSCAN_H

#include <stddef.h>

/* The scan of line[0, len) for the string under key (NUL-terminated). Returns 1 with *out
 * (buf, which must hold len bytes; buf may be line itself: the text is decoded in place, after
 * the whole line was checked) and *out_len set when the line is a valid object whose last
 * top-level `key` member is a string; -1 otherwise (an error, a missing key, or a line it is
 * not sure of; nothing written): then the caller asks jansson. */
int gj_jsonscan_text(const char *line, size_t len, const char *key, char *buf, const char **out,
                     size_t *out_len);

#endif
