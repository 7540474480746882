/**
 * @file
 * tfab, the tensor fabric: zero-copy tensor transfers between processes over RDMA fabrics.
 * This umbrella header includes the whole public API.
 */
#ifndef TFAB_TFAB_H
#define TFAB_TFAB_H

#include <tfab/export.h>
#include <tfab/status.h>
#include <tfab/log.h>
#include <tfab/config.h>
#include <tfab/engine.h>
#include <tfab/strings.h>
#include <tfab/tensorproto.h>
#include <tfab/world.h>

#ifdef __cplusplus
extern "C" {
#endif

/** The major version of these headers; tfab_version gives the library's at run time. */
#define TFAB_VERSION_MAJOR 0
/** The minor version of these headers. */
#define TFAB_VERSION_MINOR 1
/** The patch version of these headers. */
#define TFAB_VERSION_PATCH 0

/** The library's version as "major.minor.patch". Thread-safe. */
TFAB_EXPORT const char *tfab_version(void);

#ifdef __cplusplus
}
#endif

#endif
