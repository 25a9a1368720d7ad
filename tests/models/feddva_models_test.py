"""FedDVA models: closed-form Gaussian KLs against Monte Carlo, and every phase's loss against numpy."""

import numpy as np
import pytest
import tensorflow as tf

from fedpersonal.models import feddva_models as fm
from tests import tolerances

TINY = fm.DvaArchitecture(
    image_shape=(4, 4, 1),
    z_dim=2,
    c_dim=3,
    encoder_channels=(3,),
    decoder_dense=(5,),
    decoder_channels=(2, 2),
    num_classes=3,
)


def np_kl(mu_q, lv_q, mu_p, lv_p):
    return 0.5 * np.sum(lv_p - lv_q + (np.exp(lv_q) + (mu_q - mu_p) ** 2) / np.exp(lv_p) - 1.0, axis=-1)


def mc_kl(mu_q, lv_q, mu_p, lv_p, n=400000, seed=0):
    """The Monte Carlo estimate of KL(q || p) and its standard error."""
    rng = np.random.default_rng(seed)
    x = mu_q + np.exp(0.5 * lv_q) * rng.normal(size=[n, mu_q.size])
    log_q = -0.5 * np.sum(lv_q + (x - mu_q) ** 2 / np.exp(lv_q), axis=1)
    log_p = -0.5 * np.sum(lv_p + (x - mu_p) ** 2 / np.exp(lv_p), axis=1)
    return float(np.mean(log_q - log_p)), float(np.std(log_q - log_p) / np.sqrt(n))


# A Monte Carlo estimate is held to 5 standard errors: a correct closed form fails one of the test's 12 comparisons
# with probability below 12 * 5.7e-7 (normal tails; n = 400000 samples each); the float32 closed form's own rounding
# is far below a standard error.
SIGMAS = 5
# The closed-form KL of 4-dimensional Gaussians: the sum over the dimensions and the exp, division and square's
# roundings.
KL_DEPTH = 4 + 3


def test_closed_form_kls_match_monte_carlo():
    rng = np.random.default_rng(1)
    mu = rng.normal(size=[3, 4]).astype(np.float32)
    lv = rng.normal(scale=0.5, size=[3, 4]).astype(np.float32)
    centre = rng.normal(size=[1, 4]).astype(np.float32)
    standard = fm.kl_standard_normal(mu, lv).numpy()
    shifted = fm.kl_to_unit_gaussian_at(mu, lv, centre).numpy()
    pairwise = fm.pairwise_kl(mu, lv).numpy()
    for i in range(3):
        zeros = np.zeros(4)
        for got, (want, error) in (
            (standard[i], mc_kl(mu[i], lv[i], zeros, zeros)),
            (shifted[i], mc_kl(mu[i], lv[i], centre[0], zeros)),
        ):
            assert abs(got - want) <= SIGMAS * error, (got, want, error)
        for j in range(3):
            if i == j:  # KL(q || q) = 0: up to the closed form's rounding.
                tolerances.assert_reordered_close(pairwise[i, j], 0.0, depth=KL_DEPTH, scale=abs(lv[i]).sum() + 4)
                continue
            want, error = mc_kl(mu[i], lv[i], mu[j], lv[j], seed=i * 3 + j)
            assert abs(pairwise[i, j] - want) <= SIGMAS * error, (i, j, pairwise[i, j], want, error)
    # The mean over the 2 others: the KLs' sums, then 3 terms and a division.
    tolerances.assert_reordered_close(fm.mean_pairwise_kl(mu, lv).numpy(), pairwise.sum(axis=1) / 2, depth=KL_DEPTH + 4)
    # numpy's float32 closed form, in another order.
    tolerances.assert_reordered_close(
        pairwise, np.array([[np_kl(mu[i], lv[i], mu[j], lv[j]) for j in range(3)] for i in range(3)]), depth=KL_DEPTH
    )


def np_bce(x, logits):
    per_pixel = np.maximum(logits, 0) - logits * x + np.log1p(np.exp(-np.abs(logits)))
    return per_pixel.reshape(x.shape[0], -1).sum(axis=1)


# The phase losses from the Keras parts' outputs (the same eager calls): their combination's sums, in another order.
# The longest: a reconstruction's sum over the 4 x 4 pixels and mean over the batch of 5, plus c's regularizer's
# KL over 3 dimensions, the batch's mean as the slack's centre (5) and the mean over the 4 others, and the exp,
# log1p, max and weights' roundings.
LOSS_DEPTH = 4 * 4 + 5 + 3 + 5 + 4 + 4


@pytest.mark.parametrize('c_source', ['prior', 'posterior'])
def test_phase_losses_match_numpy(c_source):
    tf.keras.utils.set_random_seed(3)
    weights = fm.LossWeights(lambda_c=0.7, lambda_cc=0.4, xi=1.5, decoder_c_source=c_source)
    model = fm.DualVae(TINY, weights)
    rng = np.random.default_rng(2)
    x = rng.uniform(0, 1, size=[5, 4, 4, 1]).astype(np.float32)
    y = np.array([0, 1, 2, 1, 0], np.int32)
    eps_z = rng.normal(size=[5, 2]).astype(np.float32)
    eps_c = rng.normal(size=[5, 3]).astype(np.float32)

    # The pieces, computed by the Keras parts (training mode: batch statistics), combined in numpy.
    mu_z, lv_z = [t.numpy() for t in model.z_encoder(x, training=True)]
    z = mu_z + np.exp(0.5 * lv_z) * eps_z
    mu_c, lv_c = [t.numpy() for t in model.c_encoder([x, z], training=True)]
    c = mu_c + np.exp(0.5 * lv_c) * eps_c
    decode = lambda cc: model.decoder(np.concatenate([z, cc], -1), training=True).numpy()
    recon = np_bce(x, decode(c)).mean()
    kl_z = np_kl(mu_z, lv_z, 0.0, 0.0).mean()
    kl0 = np_kl(mu_c, lv_c, 0.0, 0.0)
    slack = np_kl(mu_c, lv_c, mu_c.mean(axis=0), 0.0)
    l_reg = np.array(
        [np.mean([np_kl(mu_c[i], lv_c[i], mu_c[j], lv_c[j]) for j in range(5) if j != i]) for i in range(5)]
    )
    constraint = np.maximum(0.0, 1.5 + l_reg - kl0)

    decoder_terms = model.phase_terms('decoder', x, eps_z, eps_c)
    expected_decoder = np_bce(x, decode(eps_c)).mean() if c_source == 'prior' else recon
    close = lambda got, want: tolerances.assert_reordered_close(got, want, depth=LOSS_DEPTH)
    close(decoder_terms['loss'].numpy(), expected_decoder)
    z_terms = model.phase_terms('z', x, eps_z, eps_c)
    close(z_terms['reconstruction'].numpy(), recon)
    close(z_terms['loss'].numpy(), recon + kl_z)
    c_terms = model.phase_terms('c', x, eps_z, eps_c)
    close(c_terms['kl_c_slack'].numpy(), slack.mean())
    close(c_terms['constraint'].numpy(), constraint.mean())
    close(c_terms['loss'].numpy(), recon + 0.7 * slack.mean() + 0.4 * constraint.mean())
    reg = fm.c_regularizer(mu_c, lv_c, lambda_c=0.7, lambda_cc=0.4, xi=1.5).numpy()
    close(reg, 0.7 * slack + 0.4 * constraint)

    # Head: cross-entropy on the inference-mode posterior means (standardized with the batch statistics).
    m_z, _, m_c, _ = [t.numpy() for t in model.encode(x, training=False)]
    logits = model.head(np.concatenate([m_z, m_c], -1), training=True).numpy()  # Batch-standardized features.
    log_softmax = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    head = model.phase_terms('head', x, eps_z, eps_c, y)
    close(head['loss'].numpy(), -log_softmax[np.arange(5), y].mean())


def test_variable_groups_partition_the_model():
    model = fm.DualVae(TINY)
    everything = {
        id(v) for part in (model.z_encoder, model.c_encoder, model.decoder, model.head) for v in part.variables
    } | {id(model.participations)}
    groups = model.global_trainable + model.private_trainable + model.private_non_trainable
    assert len(groups) == len({id(v) for v in groups}) == len(everything)
    names = [v.name for v in model.global_trainable]
    assert any('c_x_embedding' in n for n in names) and any('c_z_embedding' in n for n in names)
    assert not any('dec_' in v.name or 'head' in v.name for v in model.global_trainable)
    assert all('moving' in v.name for v in model.private_non_trainable[:-1])
    assert model.private_non_trainable[-1] is model.participations  # The noise's participation counter.


def test_architecture_validation_and_cnn():
    with pytest.raises(ValueError, match='divisible by 4'):
        fm.DvaArchitecture(image_shape=(30, 30, 1))
    cnn = fm.build_cnn_classifier((28, 28, 1), (4, 8), 8, 10)
    assert cnn(np.zeros([2, 28, 28, 1], np.float32)).shape == (2, 10)
    assert fm.PAPER.encoder_channels == (64, 128, 256, 512) and fm.PAPER.kernel_size == 4
