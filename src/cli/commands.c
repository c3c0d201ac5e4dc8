#include "cli/cli.h"

#include <stddef.h>

int gj_cmd_encode(int argc, char **argv);
int gj_cmd_decode(int argc, char **argv);
int gj_cmd_tokenize(int argc, char **argv);
int gj_cmd_train(int argc, char **argv);
int gj_cmd_eval(int argc, char **argv);
int gj_cmd_generate(int argc, char **argv);
int gj_cmd_info(int argc, char **argv);
int gj_cmd_bench(int argc, char **argv);
int gj_cmd_plan(int argc, char **argv);
int gj_cmd_convert(int argc, char **argv);
int gj_cmd_random_hf(int argc, char **argv);

const gj_command gj_commands[] = {
    {"train", "train a GPT-J (data and tensor parallel) with checkpoints and resume", 1, 0, gj_cmd_train},
    {"eval", "perplexity and bits per byte of a checkpoint on a token dataset", 1, 1, gj_cmd_eval},
    {"generate", "continue a prompt (greedy, temperature, top-k, top-p; KV cache)", 1, 1, gj_cmd_generate},
    {"bench", "time training steps: breakdown, tokens/s, MFU and GEMM efficiency", 1, 1, gj_cmd_bench},
    {"plan", "memory per rank, FLOPs, bytes sent and step time for a model and layout", 0, 1, gj_cmd_plan},
    {"convert", "Hugging Face safetensors <-> checkpoint, streaming", 1, 0, gj_cmd_convert},
    {"random-hf", "a GPT-J of any shape with random weights, as a Hugging Face directory", 0, 0, gj_cmd_random_hf},
    {"info", "metadata of a checkpoint or token dataset", 0, 1, gj_cmd_info},
    {"encode", "text on stdin -> GPT-2 token ids", 0, 1, gj_cmd_encode},
    {"decode", "GPT-2 token ids on stdin -> text", 0, 1, gj_cmd_decode},
    {"tokenize", "text / JSONL files -> token dataset (HDF5)", 1, 0, gj_cmd_tokenize},
    {NULL, NULL, 0, 0, NULL},
};
