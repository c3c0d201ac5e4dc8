#include "io/jsonscan.h"

#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 64 /* deeper: left to jansson (its own limit is 2048) */

typedef struct {
  const unsigned char *p, *e;
  int depth;
} scan;

static void ws(scan *s) {
  while (s->p < s->e && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r')) s->p++;
}

static int digit(const scan *s, const unsigned char *q) { return q < s->e && *q >= '0' && *q <= '9'; }

/* The length of the UTF-8 sequence at p (p[0] >= 0x80), or 0 if it is not one jansson accepts:
 * a bad first or continuation byte, overlong, a surrogate, beyond U+10FFFF, or cut short. */
static int utf8_len(const unsigned char *p, const unsigned char *e) {
  unsigned c = p[0], v;
  int n;
  if (c >= 0xc2 && c <= 0xdf) n = 2, v = c & 0x1f;
  else if (c >= 0xe0 && c <= 0xef) n = 3, v = c & 0x0f;
  else if (c >= 0xf0 && c <= 0xf4) n = 4, v = c & 0x07;
  else return 0;
  if (e - p < n) return 0;
  for (int i = 1; i < n; i++) {
    if ((p[i] & 0xc0) != 0x80) return 0;
    v = (v << 6) | (p[i] & 0x3f);
  }
  if ((n == 3 && v < 0x800) || (n == 4 && v < 0x10000) || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return 0;
  return n;
}

static int hex4(const scan *s, const unsigned char *q, unsigned *v) {
  if (s->e - q < 4) return 0;
  *v = 0;
  for (int i = 0; i < 4; i++) {
    unsigned c = q[i], d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : 16;
    if (d == 16) return 0;
    *v = *v << 4 | d;
  }
  return 1;
}

static size_t put_utf8(char *o, unsigned v) {
  if (v < 0x80) return o[0] = (char)v, 1;
  if (v < 0x800) return o[0] = (char)(0xc0 | v >> 6), o[1] = (char)(0x80 | (v & 0x3f)), 2;
  if (v < 0x10000)
    return o[0] = (char)(0xe0 | v >> 12), o[1] = (char)(0x80 | (v >> 6 & 0x3f)), o[2] = (char)(0x80 | (v & 0x3f)), 3;
  o[0] = (char)(0xf0 | v >> 18), o[1] = (char)(0x80 | (v >> 12 & 0x3f));
  o[2] = (char)(0x80 | (v >> 6 & 0x3f)), o[3] = (char)(0x80 | (v & 0x3f));
  return 4;
}

/* A \uXXXX escape at s->p (at the 'u'), a surrogate pair joined: its code point, 0 if invalid. */
static int unicode_escape(scan *s, unsigned *v) {
  if (!hex4(s, s->p + 1, v)) return 0;
  s->p += 5;
  if (*v >= 0xdc00 && *v <= 0xdfff) return 0; /* a low surrogate alone */
  if (*v < 0xd800 || *v > 0xdbff) return 1;
  unsigned lo;
  if (s->e - s->p < 6 || s->p[0] != '\\' || s->p[1] != 'u' || !hex4(s, s->p + 2, &lo) || lo < 0xdc00 || lo > 0xdfff)
    return 0;
  s->p += 6;
  *v = 0x10000 + ((*v - 0xd800) << 10) + (lo - 0xdc00);
  return 1;
}

/* Whether none of the 8 bytes of w is a control character, '"', '\\' or beyond ASCII (the
 * bytes a string copies as they are). */
static int plain8(uint64_t w) {
  const uint64_t ones = 0x0101010101010101ULL, high = 0x8080808080808080ULL;
  uint64_t q = w ^ (ones * '"'), b = w ^ (ones * '\\');
  uint64_t special = ((w - ones * 0x20) | (q - ones) | (b - ones)) & ~w & high;
  return !(special | (w & high));
}

/* The string at s->p (a '"'): checked, and decoded into out (when not NULL) with its length in
 * *n. *esc is set if it holds an escape. 1: valid; 0: not, or not sure. */
static int string(scan *s, char *out, size_t *n, int *esc) {
  size_t k = 0;
  s->p++;
  while (s->p < s->e) {
    uint64_t w;
    if (s->e - s->p >= 8 && (memcpy(&w, s->p, 8), plain8(w))) { /* 8 plain bytes at once */
      if (out) memmove(out + k, s->p, 8);
      k += 8, s->p += 8;
      continue;
    }
    unsigned c = *s->p;
    if (c == '"') {
      s->p++;
      if (n) *n = k;
      return 1;
    }
    if (c < 0x20) return 0;
    if (c >= 0x80) {
      int len = utf8_len(s->p, s->e);
      if (!len) return 0;
      if (out) memmove(out + k, s->p, (size_t)len); /* out may be the line itself, behind p */
      k += (size_t)len, s->p += len;
      continue;
    }
    if (c != '\\') {
      if (out) out[k] = (char)c;
      k++, s->p++;
      continue;
    }
    *esc = 1;
    if (++s->p >= s->e) return 0;
    unsigned v;
    switch (*s->p) {
    case '"': case '\\': case '/': v = *s->p, s->p++; break;
    case 'b': v = '\b', s->p++; break;
    case 'f': v = '\f', s->p++; break;
    case 'n': v = '\n', s->p++; break;
    case 'r': v = '\r', s->p++; break;
    case 't': v = '\t', s->p++; break;
    case 'u':
      if (!unicode_escape(s, &v)) return 0;
      break;
    default: return 0;
    }
    char tmp[4];
    size_t m = put_utf8(out ? out + k : tmp, v);
    k += m;
  }
  return 0;
}

/* A number: integers and decimals of up to 15 characters (no exponent), which jansson reads
 * without overflow; anything else is left to it. */
static int number(scan *s) {
  const unsigned char *q = s->p;
  if (q < s->e && *q == '-') q++;
  if (q < s->e && *q == '0') q++;
  else if (digit(s, q) && *q != '0') while (digit(s, q)) q++;
  else return 0;
  if (q < s->e && *q == '.') {
    q++;
    if (!digit(s, q)) return 0;
    while (digit(s, q)) q++;
  }
  if (q < s->e && (*q == 'e' || *q == 'E')) return 0;
  if (q - s->p > 15) return 0;
  s->p = q;
  return 1;
}

static int literal(scan *s, const char *w) {
  size_t n = strlen(w);
  if ((size_t)(s->e - s->p) < n || memcmp(s->p, w, n)) return 0;
  s->p += n;
  return 1;
}

typedef struct {
  const char *key;
  size_t key_len;
  int found;               /* the last member named key: 1 a string (at `at`), 0 not */
  const unsigned char *at; /* its opening quote */
} target;

static int value(scan *s, target *t);

/* An object at s->p (a '{'); t: the top level's, whose key member is decoded. */
static int object(scan *s, target *t) {
  if (++s->depth > MAX_DEPTH) return 0;
  s->p++, ws(s);
  if (s->p < s->e && *s->p == '}') return s->p++, s->depth--, 1;
  for (;;) {
    if (s->p >= s->e || *s->p != '"') return 0;
    const unsigned char *k0 = s->p + 1;
    int esc = 0;
    if (!string(s, NULL, NULL, &esc) || esc) return 0; /* an escaped key: jansson decides */
    size_t klen = (size_t)(s->p - 1 - k0);
    ws(s);
    if (s->p >= s->e || *s->p != ':') return 0;
    s->p++, ws(s);
    int mine = t && klen == t->key_len && !memcmp(k0, t->key, klen);
    if (mine && s->p < s->e && *s->p == '"') {
      t->at = s->p, t->found = 1;
      if (!string(s, NULL, NULL, &esc)) return 0;
    } else {
      if (mine) t->found = 0;
      if (!value(s, NULL)) return 0;
    }
    ws(s);
    if (s->p < s->e && *s->p == ',') {
      s->p++, ws(s);
      continue;
    }
    if (s->p < s->e && *s->p == '}') return s->p++, s->depth--, 1;
    return 0;
  }
}

static int array(scan *s) {
  if (++s->depth > MAX_DEPTH) return 0;
  s->p++, ws(s);
  if (s->p < s->e && *s->p == ']') return s->p++, s->depth--, 1;
  for (;;) {
    if (!value(s, NULL)) return 0;
    ws(s);
    if (s->p < s->e && *s->p == ',') {
      s->p++, ws(s);
      continue;
    }
    if (s->p < s->e && *s->p == ']') return s->p++, s->depth--, 1;
    return 0;
  }
}

static int value(scan *s, target *t) {
  if (s->p >= s->e) return 0;
  int esc = 0;
  switch (*s->p) {
  case '{': return object(s, t);
  case '[': return array(s);
  case '"': return string(s, NULL, NULL, &esc);
  case 't': return literal(s, "true");
  case 'f': return literal(s, "false");
  case 'n': return literal(s, "null");
  default: return number(s);
  }
}

int gj_jsonscan_text(const char *line, size_t len, const char *key, char *buf, const char **out,
                     size_t *out_len) {
  scan s = {(const unsigned char *)line, (const unsigned char *)line + len, 0};
  target t = {key, strlen(key), 0, NULL};
  *out = NULL, *out_len = 0;
  ws(&s);
  if (s.p >= s.e || *s.p != '{' || !object(&s, &t)) return -1;
  ws(&s);
  if (s.p != s.e || !t.found) return -1;
  /* the line is valid: decode the string (it cannot fail now; buf may be the line) */
  int esc = 0;
  s.p = t.at;
  string(&s, buf, out_len, &esc);
  *out = buf;
  return 1;
}
