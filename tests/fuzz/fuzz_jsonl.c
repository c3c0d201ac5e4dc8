/* libFuzzer harness: the JSONL and plain-text document readers. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "io/docs.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char path[] = "/tmp/gj-fuzz-docs-XXXXXX.jsonl";
  int fd = mkstemps(path, 6);
  if (fd < 0) return 0;
  if (write(fd, data, size) != (ssize_t)size) { close(fd), unlink(path); return 0; }
  close(fd);
  gj_docs d = {0};
  gj_docs_read(&d, path);
  for (size_t i = 0; i < d.ndocs; i++)
    if (d.off[i] > d.off[i + 1] || d.off[i + 1] > d.n) abort();
  gj_docs_free(&d);
  /* the same bytes as plain text */
  char path2[] = "/tmp/gj-fuzz-docs-XXXXXX.txt";
  fd = mkstemps(path2, 4);
  if (fd >= 0) {
    if (write(fd, data, size) == (ssize_t)size) {
      gj_docs t = {0};
      gj_docs_read(&t, path2);
      gj_docs_free(&t);
    }
    close(fd);
    unlink(path2);
  }
  unlink(path);
  return 0;
}
