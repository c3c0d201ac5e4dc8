/* libFuzzer harness: the `key = value` config parser with the model-key setter. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "io/kvconf.h"
#include "model/config.h"

static int set_key(void *ctx, const char *k, const char *v) { return gj_config_set(ctx, k, v); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char path[] = "/tmp/gj-fuzz-config-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return 0;
  if (write(fd, data, size) != (ssize_t)size) { close(fd), unlink(path); return 0; }
  close(fd);
  gj_config c;
  gj_config_preset(&c, "tiny");
  if (!gj_kvconf_read(path, set_key, &c)) gj_config_validate(&c);
  unlink(path);
  return 0;
}
