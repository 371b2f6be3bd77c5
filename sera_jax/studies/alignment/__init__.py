"""Image classification for the one-step-RL study: NNX ResNets, data, training steps, study."""
