/* gptj encode / gptj decode: text <-> GPT-2 token ids on stdin/stdout. Not MPI commands:
 * stdin is read whole (a pipe, a FIFO or a file), then the result is written to stdout;
 * a write error (a full disk, a closed stdout) is an error, not a short output. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "common.h"
#include "io/tokenizer.h"

static int read_stream(FILE *f, const char *what, gj_bytes *b) {
  char buf[1 << 16];
  size_t n;
  double share = gj_mem_share_bytes();
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
    /* the text (twice, while its buffer grows) and its ids (up to one a byte, 4 bytes each,
     * twice while their vector grows), refused before the memory runs out (a word of over
     * 1 MB is checked by the tokenizer for its own workspace) */
    if (share > 0 && 10.0 * (double)(b->n + n) > share)
      return GJ_FAIL("%s: more than %.2f GB of input, more than fits in the %.2f GB available: give it in parts",
                     what, (double)(b->n + n) / 1e9, share / 1e9);
    GJ_TRY(gj_bytes_append(b, buf, n));
  }

  if (ferror(f)) return GJ_FAIL("%s: read error: %s", what, strerror(errno));
  if (!b->v) GJ_TRY(gj_bytes_append(b, "", 0));
  return 0;
}

int gj_cmd_encode(int argc, char **argv) {
  const char *dir = gj_tokenizer_default_dir();
  int stats = 0;
  gj_opt opts[] = {{"vocab-dir", GJ_OPT_STR, &dir, "directory with encoder.json and vocab.bpe", 1, 0},
                   {"stats", GJ_OPT_FLAG, &stats, "print bytes, tokens and encode speed (MB/s, one thread) to stderr", 1, 0},
                   {NULL}};
  gj_cmdline cl = {"gptj encode [--vocab-dir DIR] [--stats] < text",
                   "Reads UTF-8 text (any bytes) on stdin and prints its GPT-2 token ids, "
                   "space-separated, on one line.\n<|endoftext|> in the text is ordinary text.",
                   opts, NULL, NULL, NULL, 0};
  gj_tokenizer *t = NULL;
  gj_bytes in = {0};
  gj_ids ids = {0};
  int np, rc = gj_args_parse(&cl, argc, argv, NULL, &np);
  if (rc) {
    rc = rc > 0 ? 0 : rc;
    goto done;
  }
  if ((rc = gj_tokenizer_load(&t, dir))) goto done;
  rc = read_stream(stdin, "stdin", &in);
  double t0 = gj_now();
  if (!rc) rc = gj_tokenizer_encode(t, in.v, in.n, &ids);
  double dt = gj_now() - t0;
  if (!rc && stats)
    fprintf(stderr, "encode: %zu bytes -> %zu tokens in %.3f s: %.1f MB/s, %.3f bytes/token\n", in.n,
            ids.n, dt, in.n / 1e6 / (dt > 0 ? dt : 1e-9), ids.n ? (double)in.n / ids.n : 0.0);
  if (!rc) {
    for (size_t i = 0; i < ids.n; i++) printf(i ? " %d" : "%d", ids.v[i]);
    printf("\n");
    if (fflush(stdout) || ferror(stdout)) rc = GJ_FAIL("stdout: write error: %s", strerror(errno));
  }
done:
  free(in.v), free(ids.v);
  gj_tokenizer_free(t);
  return rc;
}

int gj_cmd_decode(int argc, char **argv) {
  const char *dir = gj_tokenizer_default_dir();
  gj_opt opts[] = {{"vocab-dir", GJ_OPT_STR, &dir, "directory with encoder.json and vocab.bpe", 1, 0},
                   {NULL}};
  gj_cmdline cl = {"gptj decode [--vocab-dir DIR] < ids",
                   "Reads whitespace-separated GPT-2 token ids on stdin and writes their bytes "
                   "to stdout.", opts, NULL, NULL, NULL, 0};
  gj_tokenizer *t = NULL;
  gj_bytes in = {0}, out = {0};
  gj_ids ids = {0};
  int np, rc = gj_args_parse(&cl, argc, argv, NULL, &np);
  if (rc) {
    rc = rc > 0 ? 0 : rc;
    goto done;
  }
  if ((rc = gj_tokenizer_load(&t, dir))) goto done;
  rc = read_stream(stdin, "stdin", &in);
  /* ids are parsed as a string: a NUL would end it and drop the rest silently */
  if (!rc && memchr(in.v, 0, in.n))
    rc = GJ_FAIL("stdin: NUL byte at offset %zu, expected token ids", (size_t)((char *)memchr(in.v, 0, in.n) - in.v));
  /* ids: decimal digits, separated by white space (as isspace: space, \t \n \v \f \r) */
  static const char ws[] = " \t\n\v\f\r";
  char *p = in.v;
  size_t k = 0;
  while (!rc && *p) {
    while (*p && strchr(ws, *p)) p++;
    if (!*p) break;
    char *end = p + strspn(p, "0123456789"), *q = p + strspn(p, "0"); /* q: the significant digits */
    k++;
    long v = end - q > 9 ? LONG_MAX : strtol(q, NULL, 10); /* at most 9 digits: no overflow */
    if (end == p || (*end && !strchr(ws, *end)))
      rc = GJ_FAIL("stdin: token %zu is not an id (decimal digits)", k);
    else if (v >= gj_tokenizer_vocab_size(t))
      rc = GJ_FAIL("stdin: token %zu: id %.*s is outside the vocabulary [0, %d)", k, (int)GJ_MIN(end - p, 40), p,
                   gj_tokenizer_vocab_size(t));
    else
      rc = gj_ids_push(&ids, (int32_t)v);
    p = end;
  }
  if (!rc) rc = gj_tokenizer_decode(t, ids.v, ids.n, &out);
  if (!rc && (fwrite(out.v, 1, out.n, stdout) != out.n || fflush(stdout) || ferror(stdout)))
    rc = GJ_FAIL("stdout: write error: %s", strerror(errno));
done:
  free(in.v), free(out.v), free(ids.v);
  gj_tokenizer_free(t);
  return rc;
}
