/**
 * @file
 * Status codes. Every tfab call that can fail returns an int: 0 on success, a negative errno
 * value (-EAGAIN, -ENOMEM, ...) or the negative of one of tfab's own codes below. Codes of our
 * own start at 256 so that they never collide with errno.
 */
#ifndef TFAB_STATUS_H
#define TFAB_STATUS_H

#include <tfab/export.h>

#ifdef __cplusplus
extern "C" {
#endif

/** tfab's own status codes; a call returns the negative of one (-TFAB_ERR_PROTOCOL). */
enum tfab_status {
	TFAB_OK = 0,	      /**< success */
	TFAB_ERR_FIRST = 256, /**< the first of tfab's own codes */
	/** No usable fabric: the backend is not built in, or finds no device or provider. */
	TFAB_ERR_NO_FABRIC = 256,
	/** A peer failed (connection lost, process died, queue pair in error). */
	TFAB_ERR_PEER_FAILED = 257,
	/** A message from a peer was malformed, truncated or of an unknown type. */
	TFAB_ERR_PROTOCOL = 258,
	/** The operation was cancelled by an abort. */
	TFAB_ERR_ABORTED = 259,
	/** The remote side reported a failure for this operation. */
	TFAB_ERR_REMOTE = 260,
	/** The fabric reported an error for an operation (see the log for its own message). */
	TFAB_ERR_FABRIC = 261,
	/** A remote access was refused: bad remote key, address out of range, permissions. */
	TFAB_ERR_REMOTE_ACCESS = 262,
	/** A configuration setting has a value that cannot be parsed or used. */
	TFAB_ERR_CONFIG = 263,
	/** Protocol versions of two peers differ. */
	TFAB_ERR_VERSION = 264,
	/** The peer did not prove it holds TFAB_AUTH_KEY, or asked us to and we do not. */
	TFAB_ERR_AUTH = 265,
	/** An operation saw nothing from its peer for TFAB_OP_TIMEOUT_MS. */
	TFAB_ERR_TIMEOUT = 266,
	TFAB_ERR_LAST /**< one past the last of tfab's own codes */
};

/**
 * A static, human-readable description of a status code. Accepts either sign (-ENOMEM and
 * ENOMEM give the same text). Never returns NULL. Thread-safe.
 */
TFAB_EXPORT const char *tfab_strerror(int status);

#ifdef __cplusplus
}
#endif

#endif
