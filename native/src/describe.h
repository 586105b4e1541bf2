/*
 * describe.h -- the spaces of a make's envs from their params (ABI 5's
 * describe; see envd.h).
 *
 * A described definition is a copy of the env's definition whose spaces,
 * num_agents and state_size are describe's result for the make's params and
 * whose describe is NULL: a static definition, which the vec and every other
 * host part use as they use a plugin's.  The arrays its spaces point to are
 * owned by the envd_described_t, which must outlive every vec made from it.
 */
#ifndef ENVD_DESCRIBE_H
#define ENVD_DESCRIBE_H

#include <stddef.h>
#include <stdint.h>

#include "envd.h"

/* cffi:begin */
typedef struct envd_described envd_described_t;

/* Describe def for num_rows rows of def->num_params params each (env i's at
 * params + i * num_params; one row when every env gets the same).  Every row
 * must describe identically (rows equal to the one before are not described
 * again).  def must be valid and have a describe callback (ABI 5).  On
 * success *out owns the described definition.  Errors, with error_size bytes
 * of words in error: ENVD_EINVAL (describe failed, or gave an invalid or,
 * for two rows, a different description), ENVD_ENOMEM. */
int envd_describe(envd_described_t **out, const envd_env_def_t *def, const double *params,
                  int64_t num_rows, char *error, size_t error_size);
/* The described definition (valid, abi_version 5, describe NULL). */
const envd_env_def_t *envd_described_def(const envd_described_t *described);
/* The bytes describe took from its allocator for it (what a daemon counts
 * against --max-state-bytes besides the vec). */
uint64_t envd_described_bytes(const envd_described_t *described);
/* The most heap bytes one env of the make allocates itself (describe's
 * heap_bytes, the largest over the make's rows): a daemon counts num_envs
 * times it against --max-state-bytes. */
uint64_t envd_described_heap_bytes(const envd_described_t *described);
/* Free it (NULL allowed); no vec may use its definition any more. */
void envd_described_free(envd_described_t *described);

/* Whether def has a describe callback (an ABI 5 definition). */
int envd_env_def_describes(const envd_env_def_t *def);
/* cffi:end */

#endif /* ENVD_DESCRIBE_H */
