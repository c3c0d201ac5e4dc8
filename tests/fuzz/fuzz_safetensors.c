/* libFuzzer harness: the safetensors header parser and reader (offsets checked against the
 * file size before anything is read). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char path[] = "/tmp/gj-fuzz-st-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return 0;
  if (write(fd, data, size) != (ssize_t)size) { close(fd), unlink(path); return 0; }
  close(fd);
  gj_st_file s;
  if (!gj_st_open(&s, path)) {
    for (int i = 0; i < s.n; i++) {
      const gj_st_tensor *t = &s.t[i];
      if (t->end > size || t->begin > t->end) abort(); /* the parser promised this */
      size_t n = (t->end - t->begin) / (t->dtype == GJ_ST_F32 ? 4 : 2);
      float *buf = malloc(n * sizeof(float) + 1);
      gj_st_read_f32(&s, t, buf);
      free(buf);
    }
    gj_st_close(&s);
  }
  unlink(path);
  return 0;
}
