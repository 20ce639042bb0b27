/* Generated from frscope/records/fields.py by scripts/gen_frscan_fields.py: do not edit. */

enum {
    F_RECORD_ID,
    F_PG,
    F_SEQ,
    F_P2P_SEQ,
    F_IS_P2P,
    F_NAME,
    F_CREATED,
    F_IN_SIZES,
    F_IN_DTYPES,
    F_OUT_SIZES,
    F_OUT_DTYPES,
    F_STATE,
    F_STARTED,
    F_COMPLETED,
    F_RETIRED,
    F_TIMEOUT,
    F_THREAD_ID,
    F_THREAD_NAME,
    F_REQUIRED,
    F_DURATION = F_REQUIRED,
    F_FRAMES,
    F_COUNT,
};
static const char *FIELD_NAMES[F_COUNT] = {
    "record_id",
    "process_group",
    "collective_seq_id",
    "p2p_seq_id",
    "is_p2p",
    "profiling_name",
    "time_created_ns",
    "input_sizes",
    "input_dtypes",
    "output_sizes",
    "output_dtypes",
    "state",
    "time_discovered_started_ns",
    "time_discovered_completed_ns",
    "retired",
    "timeout_ms",
    "thread_id",
    "thread_name",
    "duration_ms",
    "frames",
};
/* the lowest regular value of each int field (0 for the others) */
static const int64_t FIELD_MIN[F_COUNT] = {
    0,  /* record_id */
    0,  /* process_group */
    -1,  /* collective_seq_id */
    -1,  /* p2p_seq_id */
    0,  /* is_p2p */
    0,  /* profiling_name */
    0,  /* time_created_ns */
    0,  /* input_sizes */
    0,  /* input_dtypes */
    0,  /* output_sizes */
    0,  /* output_dtypes */
    0,  /* state */
    0,  /* time_discovered_started_ns */
    0,  /* time_discovered_completed_ns */
    0,  /* retired */
    0,  /* timeout_ms */
    0,  /* thread_id */
    0,  /* thread_name */
    0,  /* duration_ms */
    0,  /* frames */
};
#define MAX_DURATION_MS 1000000000000.0
#define MAX_FRAME_REFS 1048576
