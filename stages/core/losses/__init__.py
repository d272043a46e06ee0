"""Loss functions as pure tensor functions: LOPD's, knowledge distillation, policy gradient, SDPO."""
