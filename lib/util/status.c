/* Status codes: tfab_strerror() names errno values and tfab's own codes. */
#include <string.h>

#include <tfab/status.h>

static const char *const own_codes[TFAB_ERR_LAST - TFAB_ERR_FIRST] = {
    [TFAB_ERR_NO_FABRIC - TFAB_ERR_FIRST] = "No usable fabric",
    [TFAB_ERR_PEER_FAILED - TFAB_ERR_FIRST] = "Peer failed",
    [TFAB_ERR_PROTOCOL - TFAB_ERR_FIRST] = "Malformed or unexpected message from peer",
    [TFAB_ERR_ABORTED - TFAB_ERR_FIRST] = "Operation aborted",
    [TFAB_ERR_REMOTE - TFAB_ERR_FIRST] = "Remote side reported a failure",
    [TFAB_ERR_FABRIC - TFAB_ERR_FIRST] = "Fabric error",
    [TFAB_ERR_REMOTE_ACCESS - TFAB_ERR_FIRST] = "Remote access error",
    [TFAB_ERR_CONFIG - TFAB_ERR_FIRST] = "Invalid configuration setting",
    [TFAB_ERR_VERSION - TFAB_ERR_FIRST] = "Protocol version mismatch",
    [TFAB_ERR_AUTH - TFAB_ERR_FIRST] = "Peer not authenticated",
    [TFAB_ERR_TIMEOUT - TFAB_ERR_FIRST] = "No progress from the peer within TFAB_OP_TIMEOUT_MS",
};

const char *tfab_strerror(int status)
{
	/* Negate in unsigned: -INT_MIN would overflow. */
	unsigned code = status < 0 ? 0u - (unsigned)status : (unsigned)status;

	if (code == 0)
		return "Success";
	if (code >= TFAB_ERR_FIRST && code < TFAB_ERR_LAST)
		return own_codes[code - TFAB_ERR_FIRST];
	if (code < TFAB_ERR_FIRST)
		/* glibc's strerror returns static text for every known errno. */
		return strerror((int)code);
	return "Unknown status";
}
