/*
 * wqbench-peers.c - durable peers of the `durable` workload, run in the
 * same process and session as libwq's own rows, so that the figures
 * compare.
 *
 * sqlite-full  The cycle against the smallest SQLite queue that keeps
 *              what libwq's FSYNC keeps: a table (id INTEGER PRIMARY
 *              KEY, key BLOB UNIQUE) in WAL mode with synchronous=FULL,
 *              where every commit fsyncs the WAL (NORMAL would not sync
 *              the add, so the key would not survive a power failure).
 *              add = INSERT OR IGNORE, one transaction; get = SELECT of
 *              the lowest id (the process keeps it as processing, as
 *              libwq keeps processing keys in memory: nothing written);
 *              done = DELETE, one transaction. Two synced commits per
 *              cycle (libwq FSYNC: one, the add's; its removal is
 *              written but not synced). Keys and counts as in `durable`.
 *
 * Built when configure finds sqlite3 (tools/deps.sh installs
 * libsqlite3-dev); otherwise the variant prints a skip line.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wqbench.h"

#ifdef WQB_HAVE_SQLITE
#include <sqlite3.h>

struct lite {
    sqlite3 *db;
    sqlite3_stmt *add, *front, *del;
};

static void lite_check(struct lite *l, int rc, int want, const char *what)
{
    if (rc != want)
        wqb_die("durable sqlite-full: %s: %s", what, sqlite3_errmsg(l->db));
}

static void lite_exec(struct lite *l, const char *sql)
{
    char *err = NULL;
    if (sqlite3_exec(l->db, sql, NULL, NULL, &err) != SQLITE_OK)
        wqb_die("durable sqlite-full: %s: %s", sql, err ? err : "?");
}

static void lite_open(struct lite *l, const char *path)
{
    if (sqlite3_open(path, &l->db) != SQLITE_OK)
        wqb_die("durable sqlite-full: open %s: %s", path, sqlite3_errmsg(l->db));
    lite_exec(l, "PRAGMA journal_mode=WAL");
    lite_exec(l, "PRAGMA synchronous=FULL");
    lite_exec(l, "CREATE TABLE q (id INTEGER PRIMARY KEY, key BLOB UNIQUE NOT NULL)");
    lite_check(l, sqlite3_prepare_v2(l->db, "INSERT OR IGNORE INTO q (key) VALUES (?)", -1,
                                     &l->add, NULL), SQLITE_OK, "prepare add");
    lite_check(l, sqlite3_prepare_v2(l->db, "SELECT key FROM q ORDER BY id LIMIT 1", -1,
                                     &l->front, NULL), SQLITE_OK, "prepare get");
    lite_check(l, sqlite3_prepare_v2(l->db, "DELETE FROM q WHERE key = ?", -1, &l->del,
                                     NULL), SQLITE_OK, "prepare done");
}

static void lite_close(struct lite *l)
{
    sqlite3_finalize(l->add);
    sqlite3_finalize(l->front);
    sqlite3_finalize(l->del);
    sqlite3_close(l->db);
}

/* Each statement runs in its own (autocommit) transaction. */
static void lite_cycles(struct lite *l, uint64_t first, uint64_t n)
{
    char key[WQB_KEY_LEN], buf[WQB_BUF_LEN];
    wqb_key(key, first);
    for (uint64_t i = 0; i < n; i++, wqb_key_next(key)) {
        sqlite3_bind_blob(l->add, 1, key, WQB_KEY_LEN, SQLITE_STATIC);
        lite_check(l, sqlite3_step(l->add), SQLITE_DONE, "add");
        sqlite3_reset(l->add);
        lite_check(l, sqlite3_step(l->front), SQLITE_ROW, "get");
        int len = sqlite3_column_bytes(l->front, 0);
        if (len != WQB_KEY_LEN)
            wqb_die("durable sqlite-full: get returned %d bytes", len);
        memcpy(buf, sqlite3_column_blob(l->front, 0), (size_t)len);
        sqlite3_reset(l->front);
        sqlite3_bind_blob(l->del, 1, buf, len, SQLITE_STATIC);
        lite_check(l, sqlite3_step(l->del), SQLITE_DONE, "done");
        sqlite3_reset(l->del);
    }
}

void wqb_peer_sqlite(const struct wqb_cfg *c)
{
    if (!wqb_want(c, "sqlite-full"))
        return;
    char dir[WQB_DIR_LEN], path[96];
    int rc = wqb_temp_dir("sqlite", dir);
    if (rc < 0)
        wqb_die("durable sqlite-full: mkdtemp: %s", strerror(-rc));
    snprintf(path, sizeof path, "%s/q.db", dir);
    struct lite l;
    lite_open(&l, path);
    uint64_t n = wqb_size(c, 500, 2000);
    struct wqb_result r;
    wqb_result_init(&r, "durable", "sqlite-full", "cycles/s");
    lite_cycles(&l, 1000000000ull, n / 10);   /* warm-up */
    for (int rep = 0; rep < wqb_reps(c); rep++) {
        uint64_t t0 = wqb_now();
        lite_cycles(&l, (uint64_t)rep * n, n);
        wqb_result_add(&r, (double)n * 1e9 / (double)(wqb_now() - t0));
    }
    wqb_result_extra(&r, "n", (double)n, WQB_X_INT);
    wqb_emit(c, &r);
    lite_close(&l);
    wqb_unregister_path(dir);
}
#else
void wqb_peer_sqlite(const struct wqb_cfg *c)
{
    if (wqb_want(c, "sqlite-full"))
        wqb_skip(c, "durable", "sqlite-full",
                 "sqlite3 not found at configure time (sh tools/deps.sh installs libsqlite3-dev)");
}
#endif
