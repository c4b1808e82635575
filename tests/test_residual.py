"""The residual model in kernel form is the same posterior as the Bayesian linear model over one-hot features."""

import itertools

import numpy as np
import pytest

from dse.perfmodel.residual import ResidualModel


def feature_posterior(keys, sizes, tau, sigma, rows, y, scale):
    """The weight-space form, written out: one-hot columns of an intercept, each knob value and each pair of values."""
    n, k = keys.shape
    cols, var = [np.ones((n, 1))], [tau[0] ** 2]
    for j, size in enumerate(sizes):
        cols.append(np.eye(size)[keys[:, j]])
        var += [tau[1] ** 2] * size
    for a, b in itertools.combinations(range(k), 2):
        cols.append(np.eye(sizes[a] * sizes[b])[keys[:, a] * sizes[b] + keys[:, b]])
        var += [tau[2] ** 2] * (sizes[a] * sizes[b])
    phi, prior = np.hstack(cols), np.array(var) * scale**2
    noise = (sigma * scale) ** 2
    X = phi[rows]
    cov = np.linalg.inv(X.T @ X / noise + np.diag(1 / prior))
    w = cov @ X.T @ np.asarray(y) / noise
    return phi @ w, np.sqrt(np.einsum("ij,jk,ik->i", phi, cov, phi) + noise)


@pytest.mark.parametrize("scale", [1.0, 3.7])
@pytest.mark.parametrize("runs", [0, 1, 6, 25])
def test_kernel_form_matches_the_feature_form(runs, scale):
    rng = np.random.default_rng(runs)
    sizes = [3, 4, 2, 5]
    keys = np.array(list(itertools.product(*(range(s) for s in sizes))))
    tau, sigma = (0.15, 0.06, 0.04), 0.03
    rows = list(rng.choice(len(keys), size=runs, replace=True))  # a repeated run is allowed
    y = rng.normal(0, 0.1, size=runs)
    mean, sd = ResidualModel(keys, *tau, sigma).posterior(rows, y, scale=scale)
    want_mean, want_sd = feature_posterior(keys, sizes, tau, sigma, rows, y, scale)
    np.testing.assert_allclose(mean, want_mean, atol=1e-9)
    np.testing.assert_allclose(sd, want_sd, atol=1e-9)


def test_a_run_moves_the_points_like_it_most():
    keys = np.array(list(itertools.product(range(3), range(3), range(3))))
    model = ResidualModel(keys, 0.15, 0.06, 0.04, 0.03)
    mean, sd = model.posterior([0], [-0.2])
    same_two = (keys[:, 0] == 0) & (keys[:, 1] == 0) & (keys[:, 2] != 0)
    none = (keys != 0).all(axis=1)
    assert mean[0] < mean[same_two].max() < mean[none].min() < 0  # all lower, the likest most
    assert sd[0] < sd[same_two].min() and sd[same_two].max() < sd[none].min()
