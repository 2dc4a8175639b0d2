/* tools/cli.h — the oomguard subcommands. */
#ifndef OG_CLI_H
#define OG_CLI_H

/* Each takes the arguments after the command name and returns the exit status. */
int og_cmd_run(int argc, char **argv);
int og_cmd_report(int argc, char **argv);
int og_cmd_merge(int argc, char **argv);
int og_cmd_stats(int argc, char **argv);
int og_cmd_top(int argc, char **argv);
int og_cmd_snapshot(int argc, char **argv);

/* Exit statuses of `run` for its own failures (as env(1) and timeout(1) use them). */
enum { OG_RUN_CANNOT_START = 125, OG_RUN_NOT_EXECUTABLE = 126, OG_RUN_NOT_FOUND = 127 };

void og_usage_run(FILE *f);
void og_usage_report(FILE *f);
void og_usage_merge(FILE *f);
void og_usage_stats(FILE *f);
void og_usage_top(FILE *f);
void og_usage_snapshot(FILE *f);

#endif
