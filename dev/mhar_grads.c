/*
dev/mhar_grads.c: dump a model and its hand-written gradients for an outside check.

It builds a model from the trainer's flags, moves every parameter away from its
initialisation (model_randomize), reads one batch (the first B*T+1 tokens of a
shard), runs forward and backward in float64, and writes
  -o CKPT   the parameters (checkpoint content 0, float32)
  -g GRADS  dLoss/dparams (content 2, float64, loss and B, T in the header)
Loss is the mean cross-entropy over the B*T positions. The parameters are
rounded to float32 before the pass, so a reader of CKPT computes from exactly
the same values. dev/torch_ref/check_grads.py compares these gradients with
PyTorch autograd.

  make dev/mhar_grads
  ./dev/mhar_grads -r mhar -H 4 -S 2 -L 2 -C 32 -NH 4 -NKV 2 -F 48 -V 97 -T 8 -B 2 -seed 7 \
                   -i SHARD.bin -o CKPT.bin -g GRADS.bin
  ./dev/mhar_grads -r hc -hc_n 4 ...   (hc: the header records n at int [29])
*/
#define TESTING
#include "train_mhar.c"

int main(int argc, char **argv) {
    // take out the flags that are ours, hand the rest to the trainer's parser
    const char *ckpt = NULL, *grads = NULL, *shard = NULL;
    int B = 2;
    unsigned long long seed = 1;
    char *rest[256];
    int nrest = 0;
    rest[nrest++] = argv[0];
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && strcmp(argv[i], "-o") == 0) { ckpt = argv[++i]; }
        else if (i + 1 < argc && strcmp(argv[i], "-g") == 0) { grads = argv[++i]; }
        else if (i + 1 < argc && strcmp(argv[i], "-i") == 0) { shard = argv[++i]; }
        else if (i + 1 < argc && strcmp(argv[i], "-B") == 0) { B = atoi(argv[++i]); }
        else if (i + 1 < argc && strcmp(argv[i], "-seed") == 0) { seed = strtoull(argv[++i], NULL, 10); }
        else if (nrest < 255) { rest[nrest++] = argv[i]; }
    }
    if (ckpt == NULL || grads == NULL || shard == NULL) {
        fprintf(stderr, "usage: %s -i SHARD -o CKPT -g GRADS [-B n] [-seed n] [model flags of train_mhar]\n", argv[0]);
        return 1;
    }
    TrainArgs args;
    args_parse(&args, nrest, rest);
    Config *cfg = &args.cfg;
    Model m;
    model_build(&m, cfg, seed, 0.02f);
    model_randomize(&m, seed);
    for (size_t i = 0; i < m.nparams; i++) { m.params_mem[i] = (real)(float)m.params_mem[i]; }
    DataLoader dl;
    dataloader_init(&dl, shard, B, cfg->T, cfg->V);
    dataloader_next(&dl);
    model_zero_grad(&m);
    model_forward(&m, dl.inputs, dl.targets, B, cfg->T, 0);
    model_backward(&m, (real)(1.0 / ((double)B * cfg->T)));
    CkptInfo info = {0};
    info.content = CKPT_PARAMS; info.elem = 4;
    model_save(&m, ckpt, info);
    info.content = CKPT_GRADS; info.elem = 8; info.B = B; info.T = cfg->T; info.loss = m.loss;
    model_save(&m, grads, info);
    printf("%s: loss %.15f, %zu parameters -> %s, %s\n", config_mode_name(cfg), (double)m.loss, m.nparams, ckpt, grads);
    dataloader_free(&dl);
    model_free(&m);
    return 0;
}
