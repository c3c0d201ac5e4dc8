#include "io/filekind.h"

#include <string.h>

#include "common.h"
#include "io/ckptattr.h"
#include "io/h5util.h"

int gj_filekind_of(const char *path, gj_filekind *kind) {
  hid_t f;
  GJ_TRY(gj_h5_open_read(path, &f));
  char fmt[64] = "";
  if (H5Aexists(f, "format") <= 0 || gj_h5_attr_str(f, path, "format", fmt, sizeof fmt)) fmt[0] = 0;
  H5Fclose(f);
  *kind = !strcmp(fmt, "gptj-mpi-tokens") ? GJ_FILE_TOKENS
        : !strcmp(fmt, GJ_CKPT_FORMAT)   ? GJ_FILE_CHECKPOINT
                                         : GJ_FILE_OTHER;
  return 0;
}
