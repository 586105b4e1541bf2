"""cffi (API mode) build of envd's native core: ``envd.native._envd_native``,
and of the facts the Python side shares with it: ``envd._native_facts``.

setup.py hands this builder to setuptools through ``cffi_modules``, so
``pip install .`` compiles the C sources with the system compiler.  The cdef
below declares only what Python calls; struct layouts come from the real
headers (``...;``), so they cannot drift from the C side.

When setuptools runs this file (and when it runs as a script), it first
writes envd._native_facts (see write_facts): the error table, limits, the
doorbell's layout and the built-in env ids, printed by a small C program
(src/print_facts.c) compiled against the same headers, so that the Python
modules that mirror them (envd.errors, envd.protocol, envd.client.doorbell...)
import them from one generated source without loading native code.
"""
import hashlib
import os
import shlex
import subprocess
import sysconfig
import tempfile
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
# Every file of src/envs/ is a built-in env (listed once, in src/builtin_envs.h).
ENV_SOURCES = sorted(f"src/envs/{p.name}" for p in (HERE / "src" / "envs").glob("*.c"))
SOURCES = ["src/errors.c", "src/rng.c", "src/pool.c", "src/vec.c", "src/builtin_envs.c",
           "src/npy_f32_trig.c", *ENV_SOURCES,
           "src/plugin.c", "src/describe.c", "src/backend_pool.c", "src/backend_workers.c",
           "src/session.c",
           "src/fast.c", "src/batch_rows.c",
           "src/segment_guard.c", "src/raster.c"]

# Bit-exactness with numpy needs IEEE arithmetic as written: no fused
# multiply-add contraction and no fast-math reassociation.
CFLAGS = ["-std=gnu11", "-O2", "-ffp-contract=off", "-fno-fast-math", "-pthread"]

CDEF = """
#define ENVD_ABI_VERSION ...
#define ENVD_ABI_VERSION_MIN ...
#define ENVD_OK ...
#define ENVD_EINVAL ...
#define ENVD_ENOMEM ...
#define ENVD_ERANGE ...
#define ENVD_ENOTFOUND ...
#define ENVD_EABI ...
#define ENVD_ESTATE ...
#define ENVD_ESYS ...
#define ENVD_EBUSY ...
#define ENVD_EENV ...
#define ENVD_ERROR_MIN ...
#define ENVD_MAX_DIMS ...
#define ENVD_MAX_INFO_FIELDS ...
#define ENVD_VEC_MAX_ENVS ...
#define ENVD_POOL_MAX_THREADS ...
#define ENVD_JOB_NOTIFY ...

typedef enum { ENVD_DTYPE_FLOAT32, ENVD_DTYPE_FLOAT64, ENVD_DTYPE_INT64,
               ENVD_DTYPE_INT32, ENVD_DTYPE_UINT8, ENVD_DTYPE_BOOL, ENVD_DTYPE_INT8,
               ... } envd_dtype_t;
typedef enum { ENVD_SPACE_BOX, ENVD_SPACE_DISCRETE, ENVD_SPACE_MULTI_DISCRETE,
               ENVD_SPACE_MULTI_BINARY, ... } envd_space_kind_t;
typedef enum { ENVD_PARAM_FLOAT, ENVD_PARAM_INT, ENVD_PARAM_BOOL, ... } envd_param_type_t;
typedef enum { ENVD_AUTORESET_NEXT_STEP, ENVD_AUTORESET_SAME_STEP,
               ENVD_AUTORESET_DISABLED, ... } envd_autoreset_mode_t;

typedef struct envd_space {
    envd_space_kind_t kind;
    envd_dtype_t dtype;
    int32_t ndim;
    int64_t shape[4];
    const double *low;
    const double *high;
    int64_t n;
    int64_t start;
    ...;
} envd_space_t;

typedef struct envd_param {
    const char *name;
    envd_param_type_t type;
    double default_value;
    double min_value;
    double max_value;
    const char *doc;
    ...;
} envd_param_t;

typedef struct envd_info_field {
    const char *name;
    envd_dtype_t dtype;
    int32_t ndim;
    int64_t shape[4];
    const char *doc;
    ...;
} envd_info_field_t;

typedef struct envd_env_def {
    uint32_t abi_version;
    const char *id;
    envd_space_t observation_space;
    envd_space_t action_space;
    size_t state_size;
    int32_t num_agents;
    int32_t max_episode_steps;
    const envd_param_t *params;
    int32_t num_params;
    const envd_info_field_t *info_fields;
    int32_t num_info_fields;
    uint32_t flags;
    const char *const *episode_fields;
    int32_t num_episode_fields;
    ...;
} envd_env_def_t;

typedef struct envd_plugin {
    uint32_t abi_version;
    int32_t num_envs;
    const envd_env_def_t *const *envs;
    ...;
} envd_plugin_t;

const char *envd_strerror(int code);
uint32_t envd_abi_version(void);
int envd_env_def_validate(const envd_env_def_t *def);
bool envd_env_def_render_info(const envd_env_def_t *def, int32_t *width, int32_t *height,
                              int32_t *fps);
const char *envd_env_def_problem(const envd_env_def_t *def);
const envd_env_def_t *envd_env_def_v5(const envd_env_def_t *def);
#define ENVD_ENV_RESETS_ITSELF ...
#define ENVD_ENV_SERIAL_INIT ...
#define ENVD_MAX_EPISODE_FIELDS ...
#define ENVD_MAX_DESCRIBE_BYTES ...
typedef struct envd_described envd_described_t;
int envd_describe(envd_described_t **out, const envd_env_def_t *def, const double *params,
                  int64_t num_rows, char *error, size_t error_size);
const envd_env_def_t *envd_described_def(const envd_described_t *described);
void envd_described_free(envd_described_t *described);
uint64_t envd_described_bytes(const envd_described_t *described);
uint64_t envd_described_heap_bytes(const envd_described_t *described);
int envd_env_def_describes(const envd_env_def_t *def);
int envd_plugin_open(const char *path, const envd_plugin_t **out, void **handle, char *error,
                     size_t error_size);
void envd_plugin_unload(void *handle);
int envd_builtin_count(void);
const envd_env_def_t *envd_builtin_get(int i);

typedef struct envd_pool envd_pool_t;
int envd_pool_create(envd_pool_t **out, int num_threads, const int *cpus);
void envd_pool_destroy(envd_pool_t *pool);
int envd_pool_num_threads(const envd_pool_t *pool);
int envd_pool_eventfd(const envd_pool_t *pool);

typedef struct envd_vec_buffers {
    void *observations;
    const void *actions;
    float *rewards;
    bool *terminations;
    bool *truncations;
    void *final_observations;
    double *episode_returns;
    int64_t *episode_lengths;
    double *episode_times;
    bool *dones;
    void *info_fields[8];
    bool *agent_mask;
    double *episode_log;
} envd_vec_buffers_t;

typedef struct envd_vec_config {
    int64_t num_envs;
    int autoreset_mode;
    int64_t max_episode_steps;
    const double *params;
    bool per_env_params;
    const uint64_t *seeds;
} envd_vec_config_t;

typedef struct envd_vec_stats {
    double cost_ns_per_env;
    int64_t inline_jobs;
    int64_t pooled_jobs;
    int64_t last_chunk;
} envd_vec_stats_t;

typedef struct envd_vec envd_vec_t;
int envd_vec_create(envd_vec_t **out, const envd_env_def_t *def,
                    const envd_vec_config_t *config,
                    const envd_vec_buffers_t *buffers, envd_pool_t *pool);
void envd_vec_destroy(envd_vec_t *vec);
void envd_vec_seed(envd_vec_t *vec, const uint64_t *seeds);
int envd_vec_reset(envd_vec_t *vec, const uint64_t *seeds, const bool *mask);
int envd_vec_step(envd_vec_t *vec);
int envd_vec_step_submit(envd_vec_t *vec);
int envd_vec_step_done(const envd_vec_t *vec);
int envd_vec_step_finish(envd_vec_t *vec);
typedef struct envd_vec_batch envd_vec_batch_t;
int envd_vec_batch_create(envd_vec_batch_t **out, int64_t capacity);
void envd_vec_batch_destroy(envd_vec_batch_t *batch);
int envd_vec_batch_submit(envd_vec_t *vec, envd_vec_batch_t *batch, const int64_t *env_ids,
                          int64_t count, int flags);
int envd_vec_batch_done(const envd_vec_batch_t *batch);
void envd_vec_batch_wait(envd_vec_t *vec, envd_vec_batch_t *batch);
int envd_vec_batch_finish(envd_vec_t *vec, envd_vec_batch_t *batch);
int64_t envd_vec_batch_size(const envd_vec_batch_t *batch);
uint64_t envd_vec_frame_bytes(const envd_vec_t *vec);
int envd_vec_render(envd_vec_t *vec, int64_t index, uint8_t *rgb);
int64_t envd_vec_error_index(const envd_vec_t *vec);
const void *envd_vec_checked_actions(const envd_vec_t *vec);
int64_t envd_vec_reset_count(const envd_vec_t *vec);
uint64_t envd_vec_memory_bytes(const envd_env_def_t *def, int64_t num_envs);
uint64_t envd_vec_batch_memory_bytes(int64_t capacity);
int64_t envd_vec_num_done(const envd_vec_t *vec);
void envd_vec_set_chunk(envd_vec_t *vec, int64_t chunk);
#define ENVD_VEC_NO_CAP ...
int envd_vec_set_max_threads(envd_vec_t *vec, int max_threads);
int envd_vec_max_threads(const envd_vec_t *vec);
void envd_vec_get_stats(const envd_vec_t *vec, envd_vec_stats_t *stats);

#define ENVD_FAST_OFFSET ...
#define ENVD_FAST_STEP ...
#define ENVD_FAST_SEND ...
#define ENVD_FAST_RECV ...
#define ENVD_FAST_SENDRECV ...
#define ENVD_FAST_LAYOUT ...
#define ENVD_FAST_SHUTTING_DOWN ...
typedef struct envd_fast_header {
    uint32_t req_seq;
    uint32_t req_kind;
    uint32_t client_waiting;
    uint32_t req_count;
    uint32_t done_seq;
    int32_t status;
    int64_t result;
    int64_t error_index;
    uint32_t closed;
    uint32_t contended;
    uint32_t sent;
    uint32_t server_asleep;
    uint32_t missed_rings;
    char message[...];
    ...;
} envd_fast_header_t;
void envd_fast_set_max_spinners(int max_spinners);

typedef struct envd_backend envd_backend_t;
int envd_backend_pool_create(envd_backend_t **out, const envd_env_def_t *def,
                             const envd_vec_config_t *config,
                             const envd_vec_buffers_t *buffers, envd_pool_t *pool);
#define ENVD_ENV_IDLE 0
#define ENVD_ENV_IN_FLIGHT 1
#define ENVD_ENV_READY 2
typedef struct envd_session envd_session_t;
int envd_session_create(envd_session_t **out, envd_backend_t *backend);
void envd_session_destroy(envd_session_t *session);
int64_t envd_session_num_envs(const envd_session_t *session);
void envd_session_lock(envd_session_t *session);
int envd_session_trylock(envd_session_t *session);
void envd_session_unlock(envd_session_t *session);
void envd_session_seed(envd_session_t *session, const uint64_t *seeds);
int envd_session_reset(envd_session_t *session, const uint64_t *seeds, const bool *mask);
int64_t envd_session_reset_count(envd_session_t *session);
int envd_session_step(envd_session_t *session);
int envd_session_step_submit(envd_session_t *session);
int envd_session_step_done(envd_session_t *session);
int envd_session_step_finish(envd_session_t *session);
int envd_session_async_reset(envd_session_t *session, const uint64_t *seeds);
int envd_session_send(envd_session_t *session, const int64_t *ids, int64_t count, int flags);
int64_t envd_session_recv(envd_session_t *session, int64_t min_count, int64_t max_count,
                          int64_t *out, int wait);
void envd_session_counts(envd_session_t *session, int64_t *in_flight, int64_t *ready);
int envd_session_env_state(envd_session_t *session, int64_t index);
int envd_session_env_started(envd_session_t *session, int64_t index);
int envd_session_render(envd_session_t *session, uint8_t *out);
uint64_t envd_session_frame_bytes(envd_session_t *session);
void envd_session_set_chunk(envd_session_t *session, int64_t chunk);
int envd_session_set_max_threads(envd_session_t *session, int max_threads);
void envd_session_stats(envd_session_t *session, envd_vec_stats_t *stats);
int64_t envd_session_error_index(const envd_session_t *session);
void envd_session_error_message(envd_session_t *session, int64_t index, char *out, size_t size);
const void *envd_session_checked_actions(const envd_session_t *session);
int64_t envd_session_steps(const envd_session_t *session);
int64_t envd_session_async_env_steps(const envd_session_t *session);
int64_t envd_session_spare_capacity(envd_session_t *session);

int envd_batch_ids(const void *ids, int itemsize, int is_signed, int64_t count,
                   int64_t num_envs, int64_t *out, int64_t *stamp, int64_t stamp_gen,
                   int64_t *bad);
void envd_batch_gather(const int64_t *rows, int64_t count, int num_buffers,
                       const void *const *src, void *const *dst, const uint64_t *row_bytes);
uint64_t envd_session_books_max_bytes(int64_t num_envs);
int envd_session_start_doorbell(envd_session_t *session, envd_fast_header_t *header,
                                int64_t *ids, int64_t spin_ns);
void envd_session_stop_doorbell(envd_session_t *session);
void envd_session_drain(envd_session_t *session);

/* backend_workers.h: Python envs hosted in worker processes (issue 17) */
#define ENVD_HOSTED_RESET ...
#define ENVD_HOSTED_STEP ...
#define ENVD_HOSTED_MESSAGE_BYTES ...
typedef struct envd_worker_ctl {
    int64_t error_env;
    char message[...];
    ...;
} envd_worker_ctl_t;
typedef struct envd_action_check {
    int64_t offset;
    int64_t low;
    int64_t high;
    int32_t size;
    int32_t is_signed;
} envd_action_check_t;
typedef struct envd_workers_leaf {
    void *segment;
    void *client;
    int64_t row_bytes;
    const uint32_t *used;
} envd_workers_leaf_t;
typedef struct envd_workers_config {
    int64_t num_envs;
    int64_t num_workers;
    envd_worker_ctl_t *ctl;
    const int *pidfds;
    uint8_t *kind;
    uint32_t *req;
    uint32_t *ack;
    int32_t *status;
    uint64_t *seeds;
    uint8_t *seed_pending;
    void *checked_actions;
    const void *actions;
    int64_t action_bytes;
    const envd_action_check_t *action_checks;
    int64_t num_action_checks;
    const bool *dones;
    int64_t spin_ns;
    int autoreset_mode;
    int (*run_inline)(void *ctx);
    void *inline_ctx;
    bool notify;
    const int *pids;
    const envd_workers_leaf_t *inputs;
    int64_t num_inputs;
    const envd_workers_leaf_t *outputs;
    int64_t num_outputs;
    int64_t timeout_ms;
    int64_t usable_cpus;
} envd_workers_config_t;
int envd_backend_workers_create(envd_backend_t **out, const envd_workers_config_t *config);
int64_t envd_backend_workers_dead(const envd_backend_t *backend);
int64_t envd_backend_workers_error_index(const envd_backend_t *backend);
void envd_backend_workers_message(const envd_backend_t *backend, int64_t index, char *out,
                                  size_t size);
int envd_backend_workers_timed_out(const envd_backend_t *backend);
uint32_t envd_worker_wait(envd_worker_ctl_t *ctl, uint32_t seen, int64_t spin_ns);
void envd_worker_fence(void);
void envd_worker_acquire(void);
void envd_worker_done(envd_worker_ctl_t *ctl);
int envd_worker_take_notify(envd_worker_ctl_t *ctl);
extern "Python" int envd_hosted_run_inline(void *ctx);

#define ENVD_SEGMENT_GUARD_SLOTS ...
int envd_segment_guard_install(void);
int envd_segment_map(int fd, size_t size, void **out);
int envd_segment_unmap(void *addr);
int envd_segment_revoked(const void *addr);
int64_t envd_segment_revocations(void);
"""

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "envd.native._envd_native",
    '#include "envd.h"\n#include "pool.h"\n#include "vec.h"\n#include "builtin_envs.h"\n'
    '#include "plugin.h"\n#include "describe.h"\n#include "fast.h"\n#include "session.h"\n'
    '#include "segment_guard.h"\n'
    '#include "backend_workers.h"\n#include "batch_rows.h"\n',
    # setuptools wants source paths relative to the project root (the cwd of
    # the build); this file may be executed from anywhere.
    sources=[os.path.relpath(HERE / s) for s in SOURCES],
    include_dirs=[os.path.relpath(HERE / "include"), os.path.relpath(HERE / "src")],
    extra_compile_args=CFLAGS,
    extra_link_args=["-pthread"],
    libraries=["m", "dl"],
)


# ---- the generated Python facts -----------------------------------------------------
FACTS_MODULE = "_native_facts.py"
FACTS_DOC = '''"""Facts of envd's native core for its Python side: the error table, limits,
the doorbell's layout in a session's segment and the built-in env ids.

GENERATED at build time by native/build_ffi.py (write_facts) from what
native/src/print_facts.c, compiled against envd.h, builtin_envs.h, fast.h,
pool.h and vec.h, prints: do not edit, change the C headers and reinstall.
Pure Python, so the client imports it without loading native code;
tests/native/test_facts.py checks it against the compiled library.
"""
'''


def package_dir(package: str, root: Path) -> Path:
    """The folder of ``package`` in the source tree at root, as setuptools maps
    it (pyproject.toml's package-dir or packages.find): the folder build_py
    copies into the wheel and an editable install imports from."""
    from setuptools.dist import Distribution
    cwd = os.getcwd()
    try:  # setuptools reads pyproject.toml from the current directory
        os.chdir(root)
        dist = Distribution()
        dist.parse_config_files()
        build_py = dist.get_command_obj("build_py")
        build_py.ensure_finalized()
        return root / build_py.get_package_dir(package)
    finally:
        os.chdir(cwd)


def _inputs_digest() -> str:
    """A digest of everything the facts are computed from."""
    digest = hashlib.sha256()
    for path in sorted(HERE.glob("include/*.h")) + sorted(HERE.glob("src/**/*.[ch]")):
        digest.update(str(path.relative_to(HERE)).encode() + b"\0" + path.read_bytes())
    digest.update(Path(__file__).read_bytes())
    return digest.hexdigest()


def print_facts() -> list[list[str]]:
    """Compile src/print_facts.c with the library's sources and run it: its
    lines, split at tabs."""
    compiler = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    with tempfile.TemporaryDirectory(prefix="envd-facts-") as tmp:
        program = os.path.join(tmp, "print_facts")
        try:
            subprocess.run([*compiler, *CFLAGS, "-O0", f"-I{HERE / 'include'}",
                            f"-I{HERE / 'src'}", str(HERE / "src/print_facts.c"),
                            *(str(HERE / s) for s in SOURCES),
                            "-o", program, "-lm", "-ldl", "-pthread"], check=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            raise RuntimeError(
                f"envd's build could not compile src/print_facts.c with {compiler[0]!r}: "
                f"{exc} (installing from source needs a C compiler, e.g. gcc, or set CC)"
            ) from None
        output = subprocess.run([program], check=True, capture_output=True, text=True).stdout
    return [line.split("\t") for line in output.splitlines()]


def facts_source(lines: list[list[str]], digest: str) -> str:
    """The text of the facts module, from print_facts' lines."""
    out = [FACTS_DOC, f"# inputs sha256: {digest}", "",
           "# The integer constants of the headers, without their ENVD_ prefix."]
    errors, fields, env_ids = [], [], []
    for kind, name, *values in lines:
        if kind == "const":  # ENVD_VEC_MAX_ENVS -> VEC_MAX_ENVS
            out.append(f"{name.removeprefix('ENVD_')} = {int(values[0])}")
        elif kind == "error":
            errors.append(f"    {name!r}: ({int(values[0])}, {values[1]!r}),")
        elif kind == "field":
            fields.append(f"    {name!r}: ({int(values[0])}, {int(values[1])}),")
        elif kind == "env":
            env_ids.append(f"    {name!r},")
        else:
            raise ValueError(f"print_facts printed an unknown kind of fact: {kind!r}")
    out += ["", "#: ENVD_ERRNO_MAP of envd.h, in table order:",
            "#: name -> (code, envd_strerror's message)",
            "ERRORS = {", *errors, "}",
            "#: envd_fast_header_t (the doorbell, at FAST_OFFSET of the header page):",
            "#: field -> (byte offset, size in bytes)",
            "FAST_HEADER_FIELDS = {", *fields, "}",
            "#: ENVD_BUILTIN_ENVS of builtin_envs.h: the built-in env ids, in table order",
            "BUILTIN_ENV_IDS = (", *env_ids, ")", ""]
    return "\n".join(out)


def write_facts(root: Path) -> Path:
    """Write the facts module into the envd package's folder of the source tree
    at root (unless it is up to date) and return its path."""
    path = package_dir("envd", root) / FACTS_MODULE
    digest = _inputs_digest()
    if path.exists() and f"# inputs sha256: {digest}\n" in path.read_text():
        return path
    text = facts_source(print_facts(), digest)
    staged = path.with_name(f".{FACTS_MODULE}.{os.getpid()}")
    staged.write_text(text)
    os.replace(staged, path)
    return path


# setuptools (cffi_modules) executes this file as "__cffi__", in the project
# root; tests/support/sanitized_build.py and tests/native/test_facts.py import
# it under other names, which writes nothing.
if __name__ in ("__cffi__", "__main__"):
    write_facts(HERE.parent)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
