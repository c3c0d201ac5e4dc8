/* libFuzzer harness: the one-pass JSONL scan (io/jsonscan.c) against jansson. Whenever the scan
 * answers for a line, jansson reads the same line as an object whose "text" member is a string
 * with exactly the bytes the scan decoded (in place, as io/docstream.c does); when it does not
 * answer, the line is left unchanged. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/jsonscan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *line = malloc(size ? size : 1);
  if (!line) abort();
  memcpy(line, data, size);
  const char *out;
  size_t n;
  int r = gj_jsonscan_text(line, size, "text", line, &out, &n);
  if (r == 1) {
    json_error_t err;
    json_t *o = json_loadb((const char *)data, size, JSON_ALLOW_NUL, &err);
    json_t *t = o && json_is_object(o) ? json_object_get(o, "text") : NULL;
    if (!t || !json_is_string(t) || json_string_length(t) != n || memcmp(json_string_value(t), out, n)) abort();
    json_decref(o);
  } else if (r != -1 || memcmp(line, data, size)) {
    abort();
  }
  free(line);
  return 0;
}
