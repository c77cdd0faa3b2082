/*
 * top.c - wqctl top: a live view of queues, drawn with ncurses; --once
 * prints one plain frame for scripts.
 *
 * Each refresh reads every queue shown (wq_stats, wq_metrics) through a
 * handle kept open between refreshes, so rates are differences of the
 * queue's own counters over the interval: adds/s from adds_total, done/s
 * from the work-duration histogram's count (one observation per wq_done;
 * 0 for a queue created with --no-metrics, which keeps no histograms). The chosen queue is also
 * walked with wq_dump, for its processing keys and the next keys to be
 * handed out. Our handle is an observer (WQ_OBSERVE): it takes no process
 * slot, so it is not counted among the attached processes and works when
 * workers hold every slot.
 */
#include "wqctl.h"

#include <curses.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_QUEUES 256
#define MAX_PROC 64     /* processing keys listed for the chosen queue */
#define MAX_NEXT 10     /* next keys listed */
#define KEY_COLS 40     /* a key's column, escaped, at most */

struct row {
    char name[WQ_MAX_NAME_LEN + 1];
    wq *q;
    int err;                   /* < 0: could not be read (the reason) */
    struct wq_stats st;
    struct wq_metrics m;
    bool have_prev;
    uint64_t prev_adds, prev_done, prev_ns;
    double add_rate, done_rate;   /* < 0: not known yet */
    bool seen;                 /* still listed (every-queue mode) */
};

struct pkey {
    char text[KEY_COLS * 4 + 8];
    pid_t pid;
    bool alive;
    uint64_t age_ns;
    uint64_t pos;
};

struct detail {
    struct pkey proc[MAX_PROC];
    size_t nproc, more_proc;
    struct pkey next[MAX_NEXT];
    size_t nnext;
    uint64_t now_ns;
};

struct top {
    struct row rows[MAX_QUEUES];
    size_t n;
    bool all;                  /* no names given: every queue here */
    size_t sel;
    int64_t interval_ns;
};

static volatile sig_atomic_t stop_sig;

static void on_stop(int sig)
{
    stop_sig = sig;
}

/* A key, escaped and cut to KEY_COLS columns (a terminal is no place for
   raw bytes). */
static void key_text(char *out, size_t cap, const void *key, size_t len)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f) {
        snprintf(out, cap, "?");
        return;
    }
    put_text(f, key, len);
    fclose(f);
    if (n > KEY_COLS) {
        snprintf(out, cap, "%.*s...", KEY_COLS - 3, buf);
    } else {
        snprintf(out, cap, "%s", buf ? buf : "");
    }
    free(buf);
}

static int find_row(struct top *t, const char *name)
{
    for (size_t i = 0; i < t->n; i++)
        if (strcmp(t->rows[i].name, name) == 0)
            return (int)i;
    return -1;
}

static int add_row(struct top *t, const char *name)
{
    int i = find_row(t, name);
    if (i >= 0) {
        t->rows[i].seen = true;
        return 0;
    }
    if (t->n == MAX_QUEUES)
        return 0;   /* the rest would not fit on any screen */
    struct row *r = &t->rows[t->n++];
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", name);
    r->add_rate = r->done_rate = -1;
    r->seen = true;
    return 0;
}

static int list_cb(const char *name, void *arg)
{
    return add_row(arg, name);
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const struct row *)a)->name, ((const struct row *)b)->name);
}

/* Every-queue mode: the queues listed now, in name order; those gone are
   dropped (their handles closed). */
static void relist(struct top *t)
{
    for (size_t i = 0; i < t->n; i++)
        t->rows[i].seen = false;
    wq_list(list_cb, t);
    size_t w = 0;
    char sel[WQ_MAX_NAME_LEN + 1] = "";
    if (t->sel < t->n)
        snprintf(sel, sizeof sel, "%s", t->rows[t->sel].name);
    for (size_t i = 0; i < t->n; i++) {
        if (!t->rows[i].seen) {
            if (t->rows[i].q)
                wq_close(t->rows[i].q);
            continue;
        }
        t->rows[w++] = t->rows[i];
    }
    t->n = w;
    qsort(t->rows, t->n, sizeof t->rows[0], by_name);
    int s = find_row(t, sel);
    t->sel = s >= 0 ? (size_t)s : t->sel < t->n ? t->sel : t->n ? t->n - 1 : 0;
}

static void read_row(struct row *r)
{
    if (!r->q) {
        int rc = observe_queue(r->name, &r->q);
        if (rc < 0) {
            r->q = NULL;
            r->err = rc;
            r->have_prev = false;
            r->add_rate = r->done_rate = -1;
            return;
        }
    }
    int rc = wq_stats(r->q, &r->st);
    if (rc == 0)
        rc = wq_metrics(r->q, &r->m);
    if (rc < 0) {
        /* Removed (or damaged) meanwhile: open it afresh next time. */
        wq_close(r->q);
        r->q = NULL;
        r->err = rc;
        r->have_prev = false;
        return;
    }
    r->err = 0;
    uint64_t now = now_mono(), done = r->m.work_duration.count;
    if (r->have_prev && now > r->prev_ns) {
        double dt = (double)(now - r->prev_ns) / 1e9;
        r->add_rate = (double)(r->st.adds_total - r->prev_adds) / dt;
        r->done_rate = done >= r->prev_done ? (double)(done - r->prev_done) / dt : 0;
    }
    r->have_prev = true;
    r->prev_adds = r->st.adds_total;
    r->prev_done = done;
    r->prev_ns = now;
}

static void refresh_rows(struct top *t)
{
    if (t->all)
        relist(t);
    for (size_t i = 0; i < t->n; i++)
        read_row(&t->rows[i]);
}

static int dump_cb(const struct wq_key_info *k, void *arg)
{
    struct detail *d = arg;
    if (k->state & WQ_KEY_PROCESSING) {
        if (d->nproc == MAX_PROC) {
            d->more_proc++;
            return 0;
        }
        struct pkey *p = &d->proc[d->nproc++];
        key_text(p->text, sizeof p->text, k->key, k->len);
        p->pid = k->owner_pid;
        p->alive = k->holder_alive;
        p->age_ns = k->started_ns && d->now_ns > k->started_ns ? d->now_ns - k->started_ns : 0;
    } else if ((k->state & WQ_KEY_QUEUED) && k->position < MAX_NEXT) {
        /* Positions are unique and dense: slot by position. */
        struct pkey *p = &d->next[k->position];
        key_text(p->text, sizeof p->text, k->key, k->len);
        p->pos = k->position;
        if (k->position + 1 > d->nnext)
            d->nnext = (size_t)k->position + 1;
    }
    return 0;
}

static int by_age(const void *a, const void *b)
{
    uint64_t x = ((const struct pkey *)a)->age_ns, y = ((const struct pkey *)b)->age_ns;
    return x < y ? 1 : x > y ? -1 : 0;
}

static void read_detail(const struct row *r, struct detail *d)
{
    memset(d, 0, sizeof *d);
    if (!r->q)
        return;
    d->now_ns = now_mono();
    for (size_t i = 0; i < MAX_NEXT; i++)
        snprintf(d->next[i].text, sizeof d->next[i].text, "?");
    wq_dump(r->q, dump_cb, d);
    qsort(d->proc, d->nproc, sizeof d->proc[0], by_age);
}

/* ---- formatting, shared by the curses view and --once ---- */

static void fmt_rate(char *out, size_t cap, double v)
{
    if (v < 0)
        snprintf(out, cap, "-");
    else if (v >= 1e6)
        snprintf(out, cap, "%.1fM", v / 1e6);
    else if (v >= 1e4)
        snprintf(out, cap, "%.1fk", v / 1e3);
    else
        snprintf(out, cap, "%.1f", v);
}

static void fmt_age(char *out, size_t cap, double s)
{
    if (s <= 0)
        snprintf(out, cap, "-");
    else if (s < 1)
        snprintf(out, cap, "%.0fms", s * 1e3);
    else if (s < 120)
        snprintf(out, cap, "%.1fs", s);
    else if (s < 7200)
        snprintf(out, cap, "%.0fm", s / 60);
    else
        snprintf(out, cap, "%.0fh", s / 3600);
}

#define HEAD_FMT "%-24s %8s %8s %8s %6s %7s %6s %6s %6s %s"

static void fmt_header(char *out, size_t cap)
{
    snprintf(out, cap, HEAD_FMT, "QUEUE", "DEPTH", "ADD/s", "DONE/s", "PROC", "OLDEST",
             "WAIT", "FAIL", "CRASH", "STATE");
}

static void fmt_row(const struct row *r, char *out, size_t cap)
{
    if (r->err < 0) {
        snprintf(out, cap, "%-24s %s", r->name,
                 r->err == -ENOENT ? "missing: no such queue" : wq_strerror(r->err));
        return;
    }
    char add[16], done[16], oldest[16], depth[24], proc[24], wait[24], failing[24], crash[24];
    fmt_rate(add, sizeof add, r->add_rate);
    fmt_rate(done, sizeof done, r->done_rate);
    fmt_age(oldest, sizeof oldest, r->m.longest_running_processor_seconds);
    snprintf(depth, sizeof depth, "%llu", (unsigned long long)r->st.queued);
    snprintf(proc, sizeof proc, "%llu", (unsigned long long)r->st.processing);
    snprintf(wait, sizeof wait, "%llu", (unsigned long long)r->st.waiting);
    snprintf(failing, sizeof failing, "%llu", (unsigned long long)r->st.failing);
    snprintf(crash, sizeof crash, "%llu", (unsigned long long)r->st.crash_requeues_total);
    snprintf(out, cap, HEAD_FMT, r->name, depth, add, done, proc, oldest, wait, failing,
             crash, r->st.shutting_down ? "shutdown" : "open");
}

/* The chosen queue's lines: a title, its processing keys, its next keys. */
static size_t fmt_detail(const struct row *r, const struct detail *d, char lines[][256],
                         size_t max)
{
    size_t n = 0;
#define LINE(...) do { if (n < max) snprintf(lines[n++], 256, __VA_ARGS__); } while (0)
    LINE("%s: %llu live of %llu, %llu attached", r->name, (unsigned long long)r->st.live,
         (unsigned long long)r->st.capacity, (unsigned long long)r->st.processes);
    LINE("%-42s %8s %6s %8s", "PROCESSING", "PID", "ALIVE", "FOR");
    for (size_t i = 0; i < d->nproc; i++) {
        char age[16];
        fmt_age(age, sizeof age, (double)d->proc[i].age_ns / 1e9);
        LINE("%-42s %8d %6s %8s", d->proc[i].text, (int)d->proc[i].pid,
             d->proc[i].alive ? "yes" : "no", age);
    }
    if (d->more_proc)
        LINE("(%zu more)", d->more_proc);
    if (d->nproc == 0)
        LINE("(none)");
    LINE("NEXT");
    for (size_t i = 0; i < d->nnext; i++)
        LINE("%2zu %s", i + 1, d->next[i].text);
    if (d->nnext == 0)
        LINE("(none)");
#undef LINE
    return n;
}

/* ---- --once ---- */

static int print_once(struct top *t)
{
    char line[512];
    int rc = EXIT_OK;
    fmt_header(line, sizeof line);
    printf("%s\n", line);
    for (size_t i = 0; i < t->n; i++) {
        fmt_row(&t->rows[i], line, sizeof line);
        printf("%s\n", line);
        if (t->rows[i].err < 0) {
            struct ectx c = { .queue = t->rows[i].name };
            fail(&c, t->rows[i].err);
            rc = EXIT_FAIL;
        }
    }
    if (t->n > 0 && t->rows[0].err == 0) {
        struct detail *d = malloc(sizeof *d);
        static char lines[MAX_PROC + MAX_NEXT + 8][256];
        if (!d)
            return out_of_memory();
        read_detail(&t->rows[0], d);
        size_t n = fmt_detail(&t->rows[0], d, lines, sizeof lines / sizeof lines[0]);
        printf("\n");
        for (size_t i = 0; i < n; i++)
            printf("%s\n", lines[i]);
        free(d);
    }
    return rc;
}

/* ---- the curses view ---- */

static void draw(struct top *t, const struct detail *d)
{
    char line[512];
    static char lines[MAX_PROC + MAX_NEXT + 8][256];
    erase();
    int rows = LINES, cols = COLS;
    mvprintw(0, 0, "wqctl top - %zu queue%s, every %.1fs   q: quit  up/down: choose  "
             "+/-: interval", t->n, t->n == 1 ? "" : "s", (double)t->interval_ns / 1e9);
    fmt_header(line, sizeof line);
    attron(A_BOLD);
    mvaddnstr(2, 0, line, cols);
    attroff(A_BOLD);
    /* The table takes up to half the screen; the chosen row stays shown. */
    int room = rows / 2 - 3 > 1 ? rows / 2 - 3 : 1;
    size_t first = t->sel >= (size_t)room ? t->sel - (size_t)room + 1 : 0;
    int y = 3;
    for (size_t i = first; i < t->n && y < 3 + room; i++, y++) {
        fmt_row(&t->rows[i], line, sizeof line);
        if (i == t->sel)
            attron(A_REVERSE);
        mvaddnstr(y, 0, line, cols);
        if (i == t->sel)
            attroff(A_REVERSE);
    }
    if (t->n == 0)
        mvaddnstr(y++, 0, "(no queues)", cols);
    y++;
    if (t->sel < t->n && t->rows[t->sel].err == 0) {
        size_t n = fmt_detail(&t->rows[t->sel], d, lines, sizeof lines / sizeof lines[0]);
        for (size_t i = 0; i < n && y < rows; i++, y++) {
            if (i == 0 || i == 1)
                attron(A_BOLD);
            mvaddnstr(y, 0, lines[i], cols);
            if (i == 0 || i == 1)
                attroff(A_BOLD);
        }
    }
    refresh();
}

static int run_curses(struct top *t)
{
    struct detail *d = calloc(1, sizeof *d);
    if (!d)
        return out_of_memory();
    if (!initscr()) {
        free(d);
        fprintf(stderr, "wqctl: top: cannot start the terminal (TERM=%s); "
                "--once prints one frame without it\n", getenv("TERM") ? getenv("TERM") : "");
        return EXIT_FAIL;
    }
    /* After initscr: ours replace the handlers curses installed, and the
       loop below ends on the flag, restoring the terminal. */
    struct sigaction sa = { .sa_handler = on_stop };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    cbreak();
    noecho();
    keypad(stdscr, TRUE);
    curs_set(0);
    set_escdelay(25);
    timeout(100);
    uint64_t next = 0;
    bool quit = false, redraw = true;
    while (!quit && !stop_sig) {
        uint64_t now = now_mono();
        if (now >= next) {
            refresh_rows(t);
            if (t->sel < t->n)
                read_detail(&t->rows[t->sel], d);
            next = now + (uint64_t)t->interval_ns;
            redraw = true;
        }
        if (redraw)
            draw(t, d);
        redraw = false;
        int ch = getch();
        switch (ch) {
        case 'q':
        case 'Q':
        case 27:   /* Esc */
            quit = true;
            break;
        case KEY_DOWN:
        case 'j':
        case '\t':
            if (t->n)
                t->sel = (t->sel + 1) % t->n;
            next = 0;
            break;
        case KEY_UP:
        case 'k':
        case KEY_BTAB:
            if (t->n)
                t->sel = (t->sel + t->n - 1) % t->n;
            next = 0;
            break;
        case '+':
            if (t->interval_ns < 60000000000ll)
                t->interval_ns *= 2;
            redraw = true;
            break;
        case '-':
            if (t->interval_ns > 100000000ll)
                t->interval_ns /= 2;
            redraw = true;
            break;
        case KEY_RESIZE:
            redraw = true;
            break;
        default:
            break;
        }
    }
    endwin();
    free(d);
    return EXIT_OK;
}

int cmd_top(const struct args *a)
{
    struct top *t = calloc(1, sizeof *t);
    if (!t)
        return out_of_memory();
    int64_t iv;
    if (!opt_duration(a, O_INTERVAL, false, 1000000000ll, &iv)) {
        free(t);
        return EXIT_USAGE;
    }
    if (iv < 100000000ll) {
        free(t);
        return usage_error(a->cmd, "--interval must be at least 100ms");
    }
    t->interval_ns = iv;
    t->all = a->npos == 0;
    for (size_t i = 0; i < a->npos; i++)
        add_row(t, a->pos[i]);
    int rc;
    if (a->val[O_ONCE]) {
        /* Two readings an interval apart: the rates are real ones. */
        refresh_rows(t);
        struct timespec ts = { (time_t)(iv / 1000000000ll), (long)(iv % 1000000000ll) };
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
            ;
        refresh_rows(t);
        rc = finish_stdout(print_once(t));
    } else if (!isatty(STDOUT_FILENO) || !isatty(STDIN_FILENO)) {
        rc = usage_error(a->cmd, "the live view needs a terminal (--once prints one "
                         "frame)");
    } else {
        rc = run_curses(t);
    }
    for (size_t i = 0; i < t->n; i++)
        if (t->rows[i].q)
            wq_close(t->rows[i].q);
    free(t);
    return rc;
}
