/* libFuzzer harness: encode then decode must give back any byte string exactly. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/tokenizer.h"

static gj_tokenizer *tok;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!tok && gj_tokenizer_load(&tok, getenv("GJ_VOCAB_DIR"))) abort();
  gj_ids ids = {0};
  gj_bytes back = {0};
  if (gj_tokenizer_encode(tok, (const char *)data, size, &ids)) abort();
  if (gj_tokenizer_decode(tok, ids.v, ids.n, &back)) abort();
  if (back.n != size || (size && memcmp(back.v, data, size))) abort();
  free(ids.v), free(back.v);
  return 0;
}
