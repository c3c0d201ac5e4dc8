/* GPT-2 byte-level BPE, as OpenAI's encoder.py: the pre-tokenizer pattern (with Unicode
 * White_Space for \s), bytes-to-unicode, then merges by rank.
 *
 * Invalid UTF-8: every byte sequence has an encoding. The pattern runs over the valid parts;
 * each maximal run of bytes that are not valid UTF-8 becomes a piece of its own and is encoded
 * byte-level like any other piece, so decode(encode(x)) == x for every byte string x. */
#ifndef GJ_IO_TOKENIZER_H
#define GJ_IO_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#define GJ_EOT_ID 50256

typedef struct gj_tokenizer gj_tokenizer;

typedef struct {
  int32_t *v;
  size_t n, cap;
} gj_ids;

typedef struct {
  char *v;
  size_t n, cap;
} gj_bytes;

/* Load encoder.json and vocab.bpe from dir (errors name the file). */
int gj_tokenizer_load(gj_tokenizer **t, const char *dir);
void gj_tokenizer_free(gj_tokenizer *t);
/* Number of ids in encoder.json (50257 for GPT-2). */
int32_t gj_tokenizer_vocab_size(const gj_tokenizer *t);
/* Append the ids of n bytes of text to out. */
int gj_tokenizer_encode(gj_tokenizer *t, const char *text, size_t n, gj_ids *out);
/* The first window, in bytes, of the pattern's matching (0: the default, 256). The result
 * does not depend on it; tests set it small, or larger than the text (one match on the whole
 * rest, PCRE2's own semantics), to check that. */
void gj_tokenizer_set_window(gj_tokenizer *t, size_t bytes);
/* Append the bytes of ids to out; an id outside the vocabulary is an error. */
int gj_tokenizer_decode(const gj_tokenizer *t, const int32_t *ids, size_t n, gj_bytes *out);

/* Growable vectors. */
int gj_ids_push(gj_ids *v, int32_t id);
int gj_bytes_append(gj_bytes *b, const char *s, size_t n);

/* Directory of the GPT-2 files: $GJ_DATA_DIR/gpt2 if set, else the installed or source data. */
const char *gj_tokenizer_default_dir(void);

#endif
