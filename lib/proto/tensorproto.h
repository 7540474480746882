/* Internal companions of tfab/tensorproto.h for the engine. */
#ifndef TFAB_PROTO_TENSORPROTO_H
#define TFAB_PROTO_TENSORPROTO_H

#include <stdint.h>

#include <tfab/strings.h>

/* A string tensor with no elements (a dimension is 0), of that shape; NULL without memory. */
struct tfab_string_tensor *tfab__strings_empty(int ndim, const int64_t *shape);

#endif
