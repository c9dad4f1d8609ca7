# %% [markdown]
# # 06 · State space models: zero-order hold, the convolution kernel, Mamba's selective scan and block
#
# A state space model is a linear differential equation read as a sequence layer. This notebook follows the Mamba
# part of the RWKV/Mamba study notes, in four steps:
#
# - **From the equation to a recurrence** (sections 1 to 5): the continuous system, its zero-order-hold (ZOH)
#   discretization derived, and the discrete recurrence written as one convolution with a kernel $\bar K$. Sections 3
#   and 4 (the matrix exponential three ways; ZOH against Euler and bilinear) are optional numerical analysis.
# - **Mamba's selective scan** (section 6): $\Delta$, $B$, $C$ change from token to token, and $\bar B$ is Euler's,
#   not ZOH's; the scan as a parallel (associative) scan; its place in the family of notebook 04, and Mamba-2's SSD.
# - **The Mamba block** (section 7): the notes' Algorithm 2 step by step, how $A$ is initialized, a model whose state
#   is carried from one piece of a text to the next (here and in transformers' cache); selection at work (section 8).
# - **The project's trained Mamba** (section 9): where its step size opens and closes on real Python, and a line of
#   text it writes.
#
# Exercises close the notebook; an appendix checks the production path (the torch, Triton and C scans, and the torch
# Mamba model) against the float64 reference.
#
# **Sources.** The Mamba/SSM part of the RWKV/Mamba study notes in the source material (the order followed here;
# errata 11 to 15 of [`reference/ERRATA.md`](../reference/ERRATA.md) are about it); Mamba, arXiv:2312.00752,
# https://arxiv.org/abs/2312.00752 (the selective scan, its discretization, the block); S4, arXiv:2111.00396,
# https://arxiv.org/abs/2111.00396 (the bilinear discretization, the convolution view).
#
# **Notation.** Sections 1 to 6 write the state $x$ and the input $u$, as S4 does; the block of section 7 writes
# them $h$ and $x'$, as Mamba and the notes do. Symbols that mean different things in different notebooks ($w$, $k$,
# $a$, $D$, $x$) are listed in the [notation crosswalk](notation.md).
#
# **Code used.** [`reference/ssm.py`](../reference/ssm.py): `expm`, `discretize_zoh`, `discretize_zoh_diagonal`,
# `discretize_euler`, `discretize_bilinear`, `ssm_kernel`, `ssm_recurrence`, `causal_convolution`,
# `selective_scan` · [`reference/mamba.py`](../reference/mamba.py): `rms_norm`, `causal_conv1d`, `mixer`, `forward`
# (NumPy, float64: the truth) · [`kernels/ssm/`](../kernels/ssm/__init__.py): `selective_scan` (backend `"torch"`: a
# chunked scan; `"triton"`: a sequential-in-time kernel, forward and backward; `"c"`: a C loop, forward and backward) ·
# [`models/mamba/`](../models/mamba/__init__.py): `MambaModel` (torch, transformers' parameter names) ·
# [`kernels/testing.py`](../kernels/testing.py): `check` and the error budgets.

# %%
import seqmix

# without a GPU: TRITON_INTERPRET=1, before triton is imported
MODE = seqmix.use_interpreter_without_gpu()

import inspect
import warnings

import matplotlib.pyplot as plt
import numpy as np
import torch

from seqmix.kernels.testing import FP16_BUDGET, FP32_BUDGET, REFERENCE_BUDGET, check, exercise, rel_rms
from seqmix.reference import family, mamba as ref_mamba, ssm as ref
from seqmix.reference.functional import softplus

rng = np.random.default_rng(0)
torch.manual_seed(0)
print("Triton kernels run on:", MODE)

# %% [markdown]
# ## 1. The continuous system
#
# An input signal $u(t)$ drives a hidden state $x(t) \in \mathbb{R}^N$ through a linear differential equation, and
# the output reads the state:
#
# $$x'(t) = A\,x(t) + B\,u(t), \qquad y(t) = C\,x(t) + D\,u(t) .$$
#
# $A$ ($N \times N$) moves the state on its own (its eigenvalues decide what decays and what oscillates), $B$ writes
# the input into the state, $C$ reads it out, $D u$ is a skip term (the notes leave it out). The notes call the
# state $h(t)$ and the input $x(t)$ in their first equations, then switch to $x$ and $u$ in the ZOH section;
# sections 1 to 6 use $x$ and $u$, as S4 does (section 7, the Mamba block, goes back to $h$ and $x'$). The notes' output equation reads $y(t) = C\,h'(t)$, with the
# derivative; it is $y(t) = C\,h(t)$ (erratum 11; section 5 shows that the notes' own convolution kernel assumes
# $y = Cx$).
#
# The example system below has $N = 4$: a damped oscillation and two real modes, lightly coupled.

# %%
N = 4
A = np.array([[-0.3, 2.0, 0.0, 0.0],
              [-2.0, -0.3, 0.0, 0.0],
              [0.0, 0.0, -0.5, 0.0],
              [0.0, 0.0, 0.0, -3.0]]) + 0.2 * rng.standard_normal((N, N))   # (N, N)
B = rng.standard_normal(N)                                                 # (N,) one input
C = rng.standard_normal(N)                                                 # (N,) one output
print("eigenvalues of A:", np.round(np.linalg.eigvals(A), 3))
assert (np.linalg.eigvals(A).real < 0).all()        # a stable system: every mode decays

# %% [markdown]
# ## 2. Zero-order hold, derived
#
# A computer sees the input at steps $t_k = k\Delta$. ZOH assumes the input is held constant between samples,
# $u(t) = u_k$ on $[t_k, t_{k+1})$, and then solves the differential equation exactly over one step. Multiply
# $x' - Ax = Bu$ by the integrating factor $e^{-At}$: the left side becomes a derivative,
#
# $$\frac{d}{dt}\left(e^{-At} x(t)\right) = e^{-At}\left(x'(t) - A x(t)\right) = e^{-At} B\,u_k .$$
#
# Integrate from $t_k$ to $t_{k+1}$, multiply by $e^{A t_{k+1}}$, and substitute $s = t_{k+1} - \tau$:
#
# $$x_{k+1} = e^{\Delta A}\,x_k + \int_{t_k}^{t_{k+1}} e^{A(t_{k+1} - \tau)}\,d\tau\; B\,u_k
# \quad\Longrightarrow\quad \bar A = e^{\Delta A}, \qquad \bar B = \int_0^{\Delta} e^{As}\,ds\; B .$$
#
# When $A$ is invertible the integral has the closed form $\bar B = A^{-1}\left(e^{\Delta A} - I\right) B$ (the notes'
# formula). The reference computes both at once, without inverting $A$, from one exponential of an augmented matrix
# (Van Loan's trick): the held input obeys $u' = 0$, so $(x, u)$ together solve a homogeneous linear system, whose
# exact one-step solution is
#
# $$\exp\!\left(\Delta \begin{pmatrix} A & B \\ 0 & 0 \end{pmatrix}\right) = \begin{pmatrix} \bar A & \bar B \\ 0 & I
# \end{pmatrix} .$$
#
# Below, the reference's $\bar B$ is checked against the closed form and against a direct numerical integral
# (Gauss-Legendre quadrature, 20 nodes, which is exact to rounding for an integrand this smooth).

# %%
delta = 0.5
A_bar, B_bar = ref.discretize_zoh(A, B, delta)                              # (N, N), (N,)

B_bar_closed = np.linalg.solve(A, ref.expm(delta * A) - np.eye(N)) @ B    # A^-1 (e^{delta A} - I) B
nodes, weights = np.polynomial.legendre.leggauss(20)                        # on [-1, 1]
s = delta / 2 * (nodes + 1)                                                 # mapped to [0, delta]
B_bar_quadrature = sum(wt * delta / 2 * ref.expm(si * A) @ B for si, wt in zip(s, weights))

# %% tags=["nbval-check-output"]
for what, actual, expected in (
    ("A_bar vs e^{delta A}", A_bar, ref.expm(delta * A)),
    ("B_bar (augmented matrix) vs A^-1 (e^{delta A} - I) B", B_bar, B_bar_closed),
    ("B_bar (augmented matrix) vs quadrature of the integral", B_bar, B_bar_quadrature),
):
    check(what, actual, expected, REFERENCE_BUDGET)

# %% [markdown]
# The augmented matrix also covers a singular $A$, where the closed form has no $A^{-1}$. For the integrator chain
# $A_0 = \begin{pmatrix} 0 & 1 \\ 0 & -1 \end{pmatrix}$, $B_0 = (0, 1)^\top$ (a position driven by a damped velocity),
# $e^{sA_0} = \begin{pmatrix} 1 & 1 - e^{-s} \\ 0 & e^{-s} \end{pmatrix}$, so by hand
# $\bar B_0 = \int_0^\Delta e^{sA_0} B_0\,ds = \left(\Delta - 1 + e^{-\Delta},\; 1 - e^{-\Delta}\right)^\top$.

# %%
A0, B0 = np.array([[0.0, 1.0], [0.0, -1.0]]), np.array([0.0, 1.0])
B0_bar_by_hand = np.array([delta - 1 + np.exp(-delta), 1 - np.exp(-delta)])
try:
    np.linalg.solve(A0, ref.expm(delta * A0) - np.eye(2))
except np.linalg.LinAlgError as error:
    print("the closed form needs A^-1:", error)

# %% tags=["nbval-check-output"]
check("ZOH B_bar of a singular A vs by hand", ref.discretize_zoh(A0, B0, delta)[1], B0_bar_by_hand,
      REFERENCE_BUDGET)
print("singular A handled: True")

# %% [markdown]
# **What Mamba needs of this, and what a first reading can skip.** Mamba's $A$ is diagonal, so $e^{\Delta A}$ is the
# elementwise exponential of the diagonal and $\bar B$ needs no matrix function at all (section 6). A general $A$
# needs a real matrix exponential, and the obvious ways to compute one fail: the power series loses everything to
# rounding for a large $\|A\|$, and the eigendecomposition fails for a matrix without a basis of eigenvectors, such
# as the Jordan block $J = \begin{pmatrix} \lambda & 1 \\ 0 & \lambda \end{pmatrix}$, whose exponential is
# $e^{\lambda}\begin{pmatrix} 1 & 1 \\ 0 & 1 \end{pmatrix}$ but for which `eig` returns two (nearly) parallel
# eigenvectors (printed below). The reference uses scaling and squaring, which needs neither property. Sections 3 and
# 4 show this in detail, and how much cheaper discretizations (Euler, bilinear) lose; they are optional, and the rest
# of the notebook does not depend on them. Section 5 goes on with the convolution view.

# %%
J_main = np.array([[-0.7, 1.0], [0.0, -0.7]])                        # a Jordan block, lambda = -0.7
_, P_jordan = np.linalg.eig(J_main)
print(f"Jordan block: the two eigenvectors eig returns have cosine {abs(P_jordan[:, 0] @ P_jordan[:, 1]):.12f}")
J_main_exact = np.exp(-0.7) * np.array([[1.0, 1.0], [0.0, 1.0]])
eig_exp = (P_jordan * np.exp(np.linalg.eigvals(J_main))) @ np.linalg.pinv(P_jordan)
print(f"e^J by eigendecomposition (pseudo-inverse): rel. error {rel_rms(eig_exp, J_main_exact):.2f}; "
      f"by reference.ssm.expm: {rel_rms(ref.expm(J_main), J_main_exact):.0e}")


# %% [markdown]
# ## 3. Optional: the matrix exponential, three ways
#
# $e^{A}$ is not the elementwise exponential of $A$. It is defined by the series
#
# $$e^{A} = \sum_{k=0}^{\infty} \frac{A^k}{k!} .$$
#
# (The notes write $\sum_{i=0}^{\infty} A^k/k!$: the summation index must be the exponent's, $k$; erratum 13.)

# %%
def expm_series(X, terms=60):
    # sum_{k < terms} X^k / k!, term by term.
    total, term = np.eye(len(X)), np.eye(len(X))
    for k in range(1, terms):
        term = term @ X / k                              # X^k / k!
        total = total + term
    return total


# %% [markdown]
# For a diagonal matrix the series reduces to exponentiating the diagonal,
# $e^{\mathrm{diag}(a)} = \mathrm{diag}(e^{a})$, and for a diagonalizable one,
#
# $$A = P\,\mathrm{diag}(\lambda)\,P^{-1} \quad\Longrightarrow\quad e^{A} = P\,\mathrm{diag}(e^{\lambda})\,P^{-1} .$$

# %%
def expm_eigen(X):
    # P diag(e^lambda) P^-1 (complex in general; the imaginary parts cancel for a real X).
    lam, P = np.linalg.eig(X)
    return ((P * np.exp(lam)) @ np.linalg.inv(P)).real


# %% [markdown]
# The third way, the one `reference.ssm.expm` uses (as do SciPy and most libraries), is *scaling and squaring*:
# $e^{A} = \left(e^{A/2^s}\right)^{2^s}$, with $s$ chosen so that $\|A/2^s\|$ is small, $e^{A/2^s}$ from a rational
# (Padé) approximant that is exact to double precision there, then $s$ squarings. The three agree on
# $\Delta A$ of section 2; the elementwise exponential does not:

# %%
X = delta * A
elementwise_gap = float(np.abs(np.exp(X) - ref.expm(X)).max())
print(f"elementwise exp is something else: max |exp(X) - e^X| = {elementwise_gap:.3f}")

# %% tags=["nbval-check-output"]
check("e^{delta A}: series vs scaling and squaring", expm_series(X), ref.expm(X), REFERENCE_BUDGET)
check("e^{delta A}: eigendecomposition vs scaling and squaring", expm_eigen(X), ref.expm(X),
      REFERENCE_BUDGET)
diagonal = np.diag([1.0, -2.0])
print("diagonal matrix, e^{diag(a)} = diag(e^a):",
      bool(np.allclose(ref.expm(diagonal), np.diag(np.exp([1.0, -2.0])))))

# %% [markdown]
# **Where two of them break.** The series is fine for a small $\|A\|$, but for a large one its terms grow to about
# $\|A\|^k/k!$ before they shrink, and for a stable (decaying) $A$ they alternate in sign and must cancel to a tiny
# result: the rounding of the large terms swamps it. The eigendecomposition fails when $A$ has no basis of
# eigenvectors: for the Jordan block $J = \begin{pmatrix} \lambda & 1 \\ 0 & \lambda \end{pmatrix}$,
# $e^{J} = e^{\lambda}\begin{pmatrix} 1 & 1 \\ 0 & 1 \end{pmatrix}$, but `eig` returns two (nearly) parallel
# eigenvectors and $P^{-1}$ is meaningless. Scaling and squaring needs neither property. Exact answers: a symmetric
# $S = Q\,\mathrm{diag}(\mu)\,Q^\top$ with orthogonal $Q$ has $e^{S} = Q\,\mathrm{diag}(e^{\mu})\,Q^\top$, and the Jordan
# block's exponential is the formula above.

# %%
Q, _ = np.linalg.qr(rng.standard_normal((6, 6)))                     # orthogonal
mu = -np.linspace(1.0, 6.0, 6)                                        # decaying modes

def symmetric(scale):
    # scale * Q diag(mu) Q^T and its exact exponential.
    return scale * (Q * mu) @ Q.T, (Q * np.exp(scale * mu)) @ Q.T

scales = np.geomspace(0.1, 10, 15)
errors = {"series (60 terms)": [], "eigendecomposition": [], "scaling and squaring": []}
for sc in scales:
    S, exact = symmetric(sc)
    for name, f in zip(errors, (expm_series, expm_eigen, ref.expm)):
        errors[name].append(max(rel_rms(f(S), exact), 1e-17))

lam = -0.7
J = np.array([[lam, 1.0], [0.0, lam]])
J_exact = np.exp(lam) * np.array([[1.0, 1.0], [0.0, 1.0]])
print(f"Jordan block: eigendecomposition rel. error {rel_rms(expm_eigen(J), J_exact):.1e}, "
      f"scaling and squaring {rel_rms(ref.expm(J), J_exact):.1e}")
S_big, exact_big = symmetric(10)
print(f"symmetric, ||S|| = 60: series rel. error {rel_rms(expm_series(S_big), exact_big):.1e}")

fig, ax = plt.subplots(figsize=(6.5, 4))
for name, errs in errors.items():
    ax.loglog(scales * 6, errs, marker="o", label=name)
ax.set_xlabel(r"$\Vert S \Vert_2$ (largest $|$eigenvalue$|$ of the symmetric test matrix)")
ax.set_ylabel(r"relative RMS error of $e^S$")
ax.set_title(r"Matrix exponential: the series fails for large $\Vert S \Vert$")
ax.legend()
plt.show()

# %% tags=["nbval-check-output"]
check("e^J (Jordan block): scaling and squaring vs exact", ref.expm(J), J_exact, REFERENCE_BUDGET)
for sc in (0.1, 1.0, 10.0):
    S, exact = symmetric(sc)
    check(f"e^S, ||S|| = {6 * sc:g}: scaling and squaring vs exact", ref.expm(S), exact,
          REFERENCE_BUDGET)

# %% [markdown]
# ## 4. Optional: ZOH against Euler and bilinear
#
# Two cheaper discretizations approximate what ZOH computes exactly. Forward Euler takes one straight step along the
# derivative; the bilinear (trapezoid, Tustin) rule averages the derivative at both ends of the step:
#
# $$\text{Euler: } \bar A = I + \Delta A, \quad \bar B = \Delta B; \qquad
# \text{bilinear: } \bar A = \left(I - \tfrac{\Delta}{2} A\right)^{-1}\left(I + \tfrac{\Delta}{2} A\right), \quad
# \bar B = \left(I - \tfrac{\Delta}{2} A\right)^{-1} \Delta B .$$
#
# Euler's $\bar A$ is the first two terms of $e^{\Delta A}$ (error $\tfrac{1}{2}\Delta^2 A^2$ per step); the bilinear
# one agrees with $e^{\Delta A}$ up to $\tfrac{1}{12}\Delta^3 A^3$. Over a fixed time $t_\text{end}$, that is
# $t_\text{end}/\Delta$ steps, the errors add up to $O(\Delta)$ for Euler and $O(\Delta^2)$ for bilinear: slopes 1
# and 2 on a log-log plot, once $\Delta$ is small enough.
#
# **Stability.** A discrete mode $\lambda$ of $A$ becomes $e^{\Delta\lambda}$ under ZOH, which lies inside the unit
# disc for every $\Delta > 0$ when $\mathrm{Re}\,\lambda < 0$: a stable system stays stable at any step. Euler turns it
# into $1 + \Delta\lambda$, inside the disc only for $|1 + \Delta\lambda| < 1$. For the oscillating mode of this $A$
# that fails at the two largest steps below ($|1 + \Delta\lambda| > 1$, printed): there Euler is *unstable*, its error
# grows with every step, and the slopes are fitted over the five smallest steps instead. (The bilinear map
# $(1 + \Delta\lambda/2)/(1 - \Delta\lambda/2)$ stays inside the disc for every $\Delta$, like ZOH.)
#
# ZOH is exact whenever the input really is held, as for the step response below (a constant input from a nonzero
# initial state), whose exact solution is $x(t) = e^{tA}x_0 + A^{-1}\left(e^{tA} - I\right)B$. (ZOH's error is
# rounding, which grows slowly with the number of steps: about $10^{-13}$ after ten thousand.)

# %%
t_end = 5.0
x0 = rng.standard_normal(N)
held = np.linalg.solve(A, ref.expm(t_end * A) - np.eye(N)) @ B                # A^-1 (e^{tA} - I) B
exact_end = ref.expm(t_end * A) @ x0 + held                                    # x(t_end), u = 1

steps = 20 * 2 ** np.arange(10)                                        # 20 .. 10240 steps
deltas = t_end / steps
methods = {"ZOH": ref.discretize_zoh, "Euler": ref.discretize_euler,
           "bilinear": ref.discretize_bilinear}
final_state = {name: [] for name in methods}
for n_steps, dt in zip(steps, deltas):
    for name, discretize in methods.items():
        Ad, Bd = discretize(A, B, dt)
        x_after = ref.ssm_recurrence(Ad, Bd, C, np.ones(n_steps), x0=x0)[1]     # x after n steps
        final_state[name].append(x_after)

# %%
oscillating = np.linalg.eigvals(A)[np.argmax(np.abs(np.linalg.eigvals(A).imag))]  # the complex mode
for dt in deltas[:3]:
    print(f"delta = {dt:.4f}: Euler |1 + delta lambda| = {abs(1 + dt * oscillating):.3f}, "
          f"ZOH |e^(delta lambda)| = {abs(np.exp(dt * oscillating)):.3f}")

step_errors = {name: np.array([rel_rms(x, exact_end) for x in xs])
               for name, xs in final_state.items()}
small = slice(-5, None)  # the five smallest steps: the asymptotic regime
slopes = {name: np.polyfit(np.log(deltas[small]), np.log(step_errors[name][small]), 1)[0]
          for name in ("Euler", "bilinear")}
print({name: round(float(sl), 2) for name, sl in slopes.items()},
      f"; worst ZOH error: {step_errors['ZOH'].max():.1e}")

fig, ax = plt.subplots(figsize=(6.5, 4.2))
for name, errs in step_errors.items():
    note = f"slope {slopes[name]:.2f}" if name in slopes else "exact for a held input"
    label = f"{name} ({note})"
    ax.loglog(deltas, np.maximum(errs, 1e-17), marker="o", label=label)
ax.axvspan(deltas[1] * 0.93, deltas[0] * 1.07, color="C1", alpha=0.12, label="Euler unstable")
ax.set_xlabel(r"step size $\Delta$")
ax.set_ylabel(r"relative error of $x(t_\mathrm{end})$, $t_\mathrm{end} = 5$")
ax.set_title("Step response: global error against the step size")
ax.legend()
plt.show()

# %% tags=["nbval-check-output"]
for n_steps, x in zip(steps[[0, 5]], np.array(final_state["ZOH"])[[0, 5]]):   # 20 and 640 steps
    check(f"ZOH, {n_steps} steps, vs the exact step response", x, exact_end, REFERENCE_BUDGET)
print("Euler is first order, bilinear second order:",
      abs(slopes["Euler"] - 1) < 0.1 and abs(slopes["bilinear"] - 2) < 0.1)
print("Euler unstable at the two largest steps only:",
      [bool(abs(1 + dt * oscillating) > 1) for dt in deltas[:4]] == [True, True, False, False])

# %% [markdown]
# ## 5. The recurrence is a convolution
#
# **An index shift first.** Section 2 derived $x_{k+1} = \bar A x_k + \bar B u_k$: the input held on
# $[t_k, t_{k+1})$ produces the state at the *end* of that interval. S4 and Mamba write the same recurrence as
#
# $$x_k = \bar A x_{k-1} + \bar B u_k ,$$
#
# naming the state after the input that has just entered it: their $x_k$ is section 2's $x_{k+1}$. Nothing else
# changes, and with this naming the output $y_k = C x_k$ already sees $u_k$. From here on (and in
# `reference.ssm.ssm_recurrence`) the second form is used.
#
# From a zero state, unroll it: $x_k = \sum_{j=0}^{k} \bar A^{j}\bar B\,u_{k-j}$, hence
# $y_k = C x_k = \sum_{j=0}^{k} \left(C\bar A^{j}\bar B\right) u_{k-j}$. That is a causal convolution with a kernel
# fixed once and for all (the notes' formula, their $M$ being the length):
#
# $$\bar K = \left(C\bar B,\; C\bar A\bar B,\; C\bar A^2\bar B,\; \dots,\; C\bar A^{M-1}\bar B\right), \qquad
# y = \bar K * u .$$
#
# The recurrence needs $T$ sequential steps; the convolution can be done for all positions at once (below with the
# FFT, $O(T \log T)$), which is how S4 trains. Both need $\bar A, \bar B, C$ to be the same at every step: a linear
# *time-invariant* system. $\bar K_j$ is the continuous impulse response $C e^{tA} B$ integrated over step $j$:
# $\bar K_j = C e^{j\Delta A}\int_0^\Delta e^{As}ds\,B = \int_{j\Delta}^{(j+1)\Delta} C e^{At} B\,dt \approx
# \Delta\, C e^{(j + 1/2)\Delta A} B$.

# %%
T_seq = 64
u_seq = rng.standard_normal(T_seq)
# (T,) the formula
K_bar = np.array([C @ np.linalg.matrix_power(A_bar, j) @ B_bar for j in range(T_seq)])
y_rec, _ = ref.ssm_recurrence(A_bar, B_bar, C, u_seq)                                   # (T,)
n_fft = 2 * T_seq                                                # zero-padded: no wrap-around
y_fft = np.fft.irfft(np.fft.rfft(K_bar, n_fft) * np.fft.rfft(u_seq, n_fft), n_fft)[:T_seq]

def kernel_by_quadrature(j):
    # int over step j of C e^{tA} B dt, with the Gauss-Legendre nodes of section 2.
    return sum(wt * delta / 2 * C @ ref.expm((j * delta + si) * A) @ B
               for si, wt in zip(s, weights))

K_integrated = np.array([kernel_by_quadrature(j) for j in range(T_seq)])

# %% tags=["nbval-check-output"]
for what, actual, expected in (
    ("kernel by the formula vs reference.ssm_kernel", K_bar,
     ref.ssm_kernel(A_bar, B_bar, C, T_seq)),
    ("kernel vs the impulse response integrated over each step", K_bar, K_integrated),
    ("recurrence vs reference.causal_convolution(K, u)", y_rec,
     ref.causal_convolution(K_bar, u_seq)),
    ("recurrence vs FFT convolution", y_rec, y_fft),
):
    check(what, actual, expected, REFERENCE_BUDGET)

# %% [markdown]
# **The output reads the state, not its derivative (erratum 11).** Had the output been $y = C x'$ as the notes write,
# then with the ZOH state $y_k = C(A x_k + B u_k)$, a different sequence, and the notes' own kernel
# $(C\bar B, C\bar A\bar B, \dots)$ would not produce it:

# %%
x_states, x = [], np.zeros(N)
for u_k in u_seq:
    x = A_bar @ x + B_bar * u_k
    x_states.append(x)
y_from_derivative = np.array([C @ (A @ x + B * u_k) for x, u_k in zip(x_states, u_seq)])
y_conv = ref.causal_convolution(K_bar, u_seq)
mismatch = rel_rms(y_conv, y_from_derivative)
print(f"notes' kernel vs y = C x': rel. error {mismatch:.2f};  "
      f"vs y = C x: {rel_rms(y_conv, y_rec):.1e}")
assert mismatch > 0.1

t_fine = np.linspace(0, (T_seq - 1) * delta, 400)
impulse = np.array([C @ ref.expm(t * A) @ B for t in t_fine])
fig, ax = plt.subplots(figsize=(7, 3.8))
ax.plot(t_fine, delta * impulse, label=r"$\Delta\, C e^{tA} B$ (continuous impulse response)")
ax.plot((np.arange(T_seq) + 0.5) * delta, K_bar, "o", markersize=3,
        label=r"$\bar K_j = C \bar A^j \bar B$ (ZOH, $\Delta = 0.5$), at $t = (j + 1/2)\Delta$")
ax.set_xlabel("time $t$")
ax.set_ylabel("kernel value")
ax.set_title("The convolution kernel: the impulse response, one value per step")
ax.legend(loc="lower right", fontsize=8)
plt.show()

# %% [markdown]
# ## 6. Mamba's selective scan
#
# Mamba makes the system depend on the input: each token brings its own step size $\Delta_t$ (per channel), its own
# $B_t$ and $C_t$ (shared by the channels). $A$ is diagonal, one row of $N$ numbers per channel $d$, so the state of a
# channel is $N$ independent scalars. For every batch element, channel $d$, state index $n$ and token $t$:
#
# $$x_t = e^{\Delta_t A}\odot x_{t-1} + \Delta_t B_t\, u_t, \qquad y_t = C_t \cdot x_t .$$
#
# Since $\bar A_t = e^{\Delta_t A}$, $\bar B_t = \Delta_t B_t$ and $C_t$ change with $t$, there is no fixed kernel
# $\bar K$: the layer is no longer a convolution. It is still a linear recurrence, $x_t = a_t \odot x_{t-1} + b_t$,
# computed for every prefix of the sequence, and that is what "scan" names: a prefix computation, like a cumulative
# sum. The loop below runs it one token after another, the plainest way to write it; it does not have to run that
# way. The end of this section derives the parallel (associative) scan, which takes about $\log_2 T$ steps. (Mamba
# adds a skip $D u_t$ and a gate; section 7 puts them in.)

# %%
def selective_scan(u, delta, A, B, C, zoh_b=False):
    # u, delta: (batch, D, T); A: (D, N); B, C: (batch, N, T) -> y (batch, D, T).
    x = np.zeros((u.shape[0], u.shape[1], A.shape[1]))             # (batch, D, N)
    y = np.empty(u.shape)
    for t in range(u.shape[2]):
        step = delta[:, :, t, None]                                 # (batch, D, 1)
        A_bar_t = np.exp(step * A)                                  # (batch, D, N)
        # ZOH or Mamba's (Euler)
        B_bar_t = ((A_bar_t - 1) / A if zoh_b else step) * B[:, None, :, t]
        x = A_bar_t * x + B_bar_t * u[:, :, t, None]
        y[:, :, t] = (x * C[:, None, :, t]).sum(axis=-1)
    return y


# %% [markdown]
# **What the notes write (erratum 12).** Their Algorithm 1 returns $\bar A = \Delta \otimes A$ and
# $\bar B = \Delta \otimes B$, right after deriving ZOH. The first lacks the exponential: $\bar A = e^{\Delta A}$,
# as in section 2 (with $A < 0$, $e^{\Delta A} \in (0, 1)$ is a decay, while $\Delta A < 0$ would flip the state's
# sign at every step and, once $\Delta |A| > 1$, blow it up). The second is not ZOH's $\bar B$: it is Euler's,
# $\bar B = \Delta B$, which Mamba uses on purpose (a simplification: it agrees with ZOH's to first order in
# $\Delta$, both being $\Delta B + O(\Delta^2)$, while their ratio is $1 - \Delta A/2 + O(\Delta^2 A^2)$). For diagonal $A$, ZOH's is (the `zoh_b=True` branch above)
#
# $$\bar B^{\text{ZOH}} = \frac{e^{\Delta A} - 1}{A}\, B, \qquad
# \frac{\bar B^{\text{Euler}}}{\bar B^{\text{ZOH}}} = \frac{\Delta A}{e^{\Delta A} - 1} = 1 - \frac{\Delta A}{2} +
# O(\Delta^2 A^2),$$
#
# close to 1 for small steps, about $\Delta |A|$ for large ones. The reference computes Mamba's scan
# (`zoh_b=False`, the default) and the exact-ZOH variant (`zoh_b=True`). To test the scan as an operation, the
# inputs below are drawn at random, $B$ and $C$ included; in a Mamba block they are made from the input (section 7),
# and that is what "selective" means.

# %%
batch, D_ch, N_st, T_seq = 2, 3, 4, 16
u_s = rng.standard_normal((batch, D_ch, T_seq))                          # (batch, D, T)
# softplus: positive steps
delta_s = np.log1p(np.exp(rng.standard_normal((batch, D_ch, T_seq)) - 1))
A_s = -np.exp(rng.standard_normal((D_ch, N_st)))  # (D, N) negative: decaying modes
B_s, C_s = (rng.standard_normal((batch, N_st, T_seq)) for _ in range(2))    # (batch, N, T)
y_mamba = selective_scan(u_s, delta_s, A_s, B_s, C_s)
y_zoh = selective_scan(u_s, delta_s, A_s, B_s, C_s, zoh_b=True)

# %% tags=["nbval-check-output"]
for what, actual, expected in (
    ("selective scan (Mamba's B_bar) vs reference.selective_scan", y_mamba,
     ref.selective_scan(u_s, delta_s, A_s, B_s, C_s)[0]),
    ("selective scan (ZOH B_bar) vs reference.selective_scan(zoh_b=True)", y_zoh,
     ref.selective_scan(u_s, delta_s, A_s, B_s, C_s, zoh_b=True)[0]),
):
    check(what, actual, expected, REFERENCE_BUDGET)

# %% [markdown]
# **Selection switched off, it is the time-invariant system again.** With $\Delta$, $B$, $C$ the same at every token,
# each channel $d$ is the SSM of sections 2 to 5 with $A = \mathrm{diag}(A_d)$: the ZOH variant equals the recurrence
# with `discretize_zoh_diagonal`, and Mamba's equals it with $\bar A = e^{\Delta A}$, $\bar B = \Delta B$.

# %%
d_const, B_const, C_const = 0.3, rng.standard_normal(N_st), rng.standard_normal(N_st)
u_1 = u_s[:1]  # one batch element, (1, D, T)
delta_1 = np.full(u_1.shape, d_const)
B_1, C_1 = (np.repeat(vec[None, :, None], T_seq, axis=2) for vec in (B_const, C_const))  # (1, N, T)
scan_zoh = ref.selective_scan(u_1, delta_1, A_s, B_1, C_1, zoh_b=True)[0]
scan_mamba = ref.selective_scan(u_1, delta_1, A_s, B_1, C_1)[0]
lti_zoh, lti_mamba = np.empty_like(scan_zoh), np.empty_like(scan_mamba)
for ch in range(D_ch):
    a_bar, b_bar = ref.discretize_zoh_diagonal(A_s[ch], B_const, d_const)          # (N,), (N,)
    lti_zoh[0, ch] = ref.ssm_recurrence(np.diag(a_bar), b_bar, C_const, u_1[0, ch])[0]
    lti_mamba[0, ch] = ref.ssm_recurrence(np.diag(a_bar), d_const * B_const, C_const, u_1[0, ch])[0]

# %% tags=["nbval-check-output"]
check("constant delta, B, C: ZOH scan vs LTI recurrence (ZOH)", scan_zoh, lti_zoh, REFERENCE_BUDGET)
check("constant delta, B, C: Mamba scan vs LTI recurrence (exp(delta A), delta B)", scan_mamba,
      lti_mamba, REFERENCE_BUDGET)
print("Mamba's and ZOH's outputs differ here: rel. difference > 1%:",
      rel_rms(scan_mamba, scan_zoh) > 0.01)


# %% [markdown]
# **How much Euler's $\bar B$ differs.** Left: the ratio $\bar B^{\text{Euler}}/\bar B^{\text{ZOH}} =
# \Delta A/(e^{\Delta A} - 1)$ against $\Delta|A|$, with its first-order expansion $1 + \Delta|A|/2$. Right: the
# relative difference between the two scans' outputs as the step sizes grow (all $\Delta$ scaled by a common
# factor). Mamba learns its parameters with its own $\bar B$, so this is a different model, not an error; but it is
# not the zero-order hold that the notes' Algorithm 1 says it is. And the notes' $\bar A = \Delta A$ (no
# exponential) makes the state explode:

# %%
def scan_with_A_bar_as_printed(u, delta, A, B, C):
    # The notes' Algorithm 1 taken literally: A_bar = delta * A (no exp), B_bar = delta * B.
    x = np.zeros((u.shape[0], u.shape[1], A.shape[1]))
    for t in range(u.shape[2]):
        step = delta[:, :, t, None]
        x = step * A * x + step * B[:, None, :, t] * u[:, :, t, None]
    return np.abs(x).max()

with_exp = np.abs(ref.selective_scan(u_s, 4 * delta_s, A_s, B_s, C_s)[1]).max()
as_printed = scan_with_A_bar_as_printed(u_s, 4 * delta_s, A_s, B_s, C_s)
print(f"largest |state| after {T_seq} tokens, delta x 4: A_bar = exp(delta A): {with_exp:.2f};  "
      f"A_bar = delta A as printed: {as_printed:.2e}")

# %%
x_axis = np.geomspace(1e-3, 20, 200)                       # delta |A|
factors = np.geomspace(0.01, 30, 25)
output_diff = [rel_rms(ref.selective_scan(u_s, f * delta_s, A_s, B_s, C_s)[0],
                       ref.selective_scan(u_s, f * delta_s, A_s, B_s, C_s, zoh_b=True)[0])
               for f in factors]
typical_step = np.median(delta_s[..., None] * np.abs(A_s)[None, :, None, :])   # median delta |A|
fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), constrained_layout=True)
axes[0].loglog(x_axis, x_axis / -np.expm1(-x_axis), label=r"$\Delta A / (e^{\Delta A} - 1)$")
axes[0].loglog(x_axis, 1 + x_axis / 2, "--", label=r"$1 + \Delta |A| / 2$ (first order)")
axes[0].set_xlabel(r"$\Delta |A|$")
axes[0].set_ylabel(r"$\bar B$ (Euler, Mamba) / $\bar B$ (ZOH)")
axes[0].set_title(r"Mamba's $\bar B$ against the ZOH one")
axes[0].legend()
axes[1].loglog(factors * typical_step, output_diff, marker="o")
axes[1].set_xlabel(r"median $\Delta |A|$ over the sequence")
axes[1].set_ylabel("rel. difference of the outputs")
axes[1].set_title(r"Selective scan: Mamba's $\bar B$ vs exact ZOH")
plt.show()

# %% [markdown]
# ### A scan need not be sequential: the parallel (associative) scan
#
# Fix one batch element, channel $d$ and state index $n$. The scan is then a scalar recurrence,
#
# $$x_t = a_t\,x_{t-1} + b_t, \qquad a_t = e^{\Delta_t A_{d,n}}, \quad b_t = \Delta_t B_{t,n}\, u_{t}, \quad
# x_{-1} = 0 .$$
#
# Step $t$ is the affine map $x \mapsto a_t x + b_t$, written as the pair $(a_t, b_t)$. Applying $(a, b)$ and then
# $(a', b')$ gives $a'(a x + b) + b' = (a a')\,x + (a' b + b')$, a map of the same kind. So define
#
# $$(a, b) \circ (a', b') = (a\,a',\; a'\,b + b') ,$$
#
# and $x_t$ is the second half of $(a_0, b_0) \circ (a_1, b_1) \circ \dots \circ (a_t, b_t)$ (the map of the first
# $t + 1$ steps applied to $x_{-1} = 0$; a state carried in from an earlier piece is folded into $b_0 + a_0 x_{-1}$).
#
# **Why it is associative.** It is the composition of functions, which is always associative; written out,
#
# $$\big((a, b) \circ (a', b')\big) \circ (a'', b'') = (a a' a'',\; a''(a' b + b') + b'')
#   = (a a' a'',\; a'' a' b + a'' b' + b'') ,$$
# $$(a, b) \circ \big((a', b') \circ (a'', b'')\big) = (a\,(a' a''),\; (a' a'')\, b + (a'' b' + b'')) ,$$
#
# the same pair. It is not commutative: $(a', b') \circ (a, b) = (a a', a b' + b)$, the steps in the other order.
# Checked on random numbers:

# %%
def combine(first, second):
    # (a, b) o (a', b') = (a a', a' b + b'): first the step(s) of `first`, then those of `second`.
    (a1, b1), (a2, b2) = first, second
    return a1 * a2, a2 * b1 + b2

pair_rng = np.random.default_rng(1)        # its own generator: the later sections keep their inputs
p1, p2, p3 = ((pair_rng.standard_normal(5), pair_rng.standard_normal(5)) for _ in range(3))   # (a, b) pairs

# %% tags=["nbval-check-output"]
check("(p1 o p2) o p3 vs p1 o (p2 o p3)", combine(combine(p1, p2), p3), combine(p1, combine(p2, p3)),
      REFERENCE_BUDGET)
print("p1 o p2 differs from p2 o p1:", rel_rms(combine(p1, p2)[1], combine(p2, p1)[1]) > 0.01)

# %% [markdown]
# Associativity is what lets the work be regrouped. Hillis and Steele's scan runs $\lceil \log_2 T \rceil$ rounds;
# in the round with offset $s = 1, 2, 4, \dots$ every position $t \ge s$ at once combines the pair $s$ positions
# back into its own,
#
# $$P_t \leftarrow P_{t-s} \circ P_t ,$$
#
# so that after the round $P_t$ covers the steps $t - 2s + 1$ to $t$ (or from 0). After the last round $P_t$ covers
# steps 0 to $t$ and its second half is $x_t$. Each round is one vectorized operation over all positions (on a GPU,
# all positions in parallel): $\log_2 T$ dependent steps instead of $T$, for about $T \log_2 T$ combines instead of
# $T$. (Blelloch's version, an up-sweep and a down-sweep over a tree, does $O(T)$ combines in $2 \log_2 T$ steps.)
# The same selective-scan inputs as above, every batch element, channel and state index at once, against the
# sequential loop `selective_scan`:

# %%
def hillis_steele_scan(a, b):
    # Inclusive scan of the pairs (a_t, b_t) along the last axis; returns x_t for every t (x_{-1} = 0).
    a, b = a.copy(), b.copy()
    s, rounds = 1, 0
    while s < a.shape[-1]:
        # all t >= s at once; the right side is computed from the old values before either is overwritten
        a[..., s:], b[..., s:] = combine((a[..., :-s], b[..., :-s]), (a[..., s:], b[..., s:]))
        s, rounds = 2 * s, rounds + 1
    return b, rounds

a_pairs = np.exp(delta_s[:, :, None, :] * A_s[None, :, :, None])      # (batch, D, N, T): e^{delta_t A}
b_pairs = (delta_s * u_s)[:, :, None, :] * B_s[:, None, :, :]         # (batch, D, N, T): delta_t B_t u_t
x_parallel, rounds = hillis_steele_scan(a_pairs, b_pairs)
y_parallel = (x_parallel * C_s[:, None, :, :]).sum(axis=2)            # y_t = C_t . x_t: (batch, D, T)

# %% tags=["nbval-check-output"]
check(f"Hillis-Steele scan ({rounds} rounds) vs the sequential loop ({T_seq} steps)", y_parallel, y_mamba,
      REFERENCE_BUDGET)

# %% [markdown]
# The rounds for $T = 8$, drawn: a row per round, an arrow from $t - s$ into every $t \ge s$ (the combine
# $P_t \leftarrow P_{t-s} \circ P_t$), and under each position the steps its pair covers after the round. Three
# rounds (offsets 1, 2, 4) and every position covers $0..t$.

# %%
T_draw, offsets = 8, (1, 2, 4)
fig, ax = plt.subplots(figsize=(9, 3.6), constrained_layout=True)
for r, s_off in enumerate(offsets):
    y_from, y_to = len(offsets) - r, len(offsets) - r - 1                  # round r: from row y_from to y_to
    for t in range(s_off, T_draw):
        ax.annotate("", xy=(t, y_to + 0.12), xytext=(t - s_off, y_from - 0.12),
                    arrowprops=dict(arrowstyle="-|>", color=f"C{r}", lw=0.9))
    for t in range(T_draw):
        low = max(0, t - 2 * s_off + 1)                                     # the steps P_t covers after the round
        ax.text(t, y_to, f"{low}..{t}" if low < t else f"{t}", ha="center", va="center", fontsize=8,
                bbox=dict(boxstyle="round,pad=0.2", fc="white", ec=f"C{r}"))
    ax.text(-0.9, y_from - 0.5, f"offset {s_off}", ha="right", va="center", color=f"C{r}", fontsize=9)
for t in range(T_draw):
    ax.text(t, len(offsets), f"{t}", ha="center", va="center", fontsize=8, bbox=dict(boxstyle="round,pad=0.2",
                                                                                   fc="#eee", ec="grey"))
ax.set(xlim=(-2.2, T_draw - 0.5), ylim=(-0.5, len(offsets) + 0.5), yticks=[], xticks=range(T_draw))
ax.set_xlabel("position t (top: the pairs (a_t, b_t) of one step each; below: the steps covered after each round)")
ax.set_title("Hillis-Steele scan, T = 8: three rounds, every arrow of a round at once")
for side in ("left", "right", "top"):
    ax.spines[side].set_visible(False)
plt.show()

# %% [markdown]
# So "scan" names the prefix computation (the name comes from the parallel-computing primitive, of which the
# cumulative sum, $a_t = 1$, is the simplest case), not a sequential loop; a selective SSM trains in parallel over
# time because its $\circ$ is associative. Real kernels mix the two: Mamba's paper runs a work-efficient parallel
# scan inside its fused GPU kernel, and the project's torch backend (`kernels/ssm/`) is the same operator at the
# level of chunks: it computes each chunk's pair (the chunk's whole decay $\prod a_t$, and its exit state from zero)
# for all chunks at once, combines the chunks' pairs in order, then recomputes the states inside every chunk at once
# from its true entering state.
#
# **The matrix analogue.** RWKV-7's state update $S_t = S_{t-1} G_t + v_t k_t^\top$, with the transition
# $G_t = \mathrm{diag}(w_t) + a_t b_t^\top$, has the same form with matrices: pairs $(G, V)$ combine as
# $(G, V) \circ (G', V') = (G G', V G' + V')$, associative for the same reason. But each combine multiplies
# $N \times N$ matrices, so instead of a tree of such products the chunked WY form of
# [notebook 04](04_rwkv7_delta_rule.ipynb), section 6, keeps a chunk's product of transitions in factored (WY) form
# and passes the state from chunk to chunk, exactly as the chunked scan above does with its scalars.
#
# Sources: Hillis and Steele, "Data parallel algorithms" (1986), https://doi.org/10.1145/7902.7903; Blelloch,
# "Prefix sums and their applications" (1990), https://www.cs.cmu.edu/~guyb/papers/Ble93.pdf; Martin and Cundy,
# linear recurrences by parallel scan, arXiv:1709.04057, https://arxiv.org/abs/1709.04057; Mamba, arXiv:2312.00752,
# section 3.3.

# %% [markdown]
# ### The selective scan in the family
#
# Notebook 04 opens with the recurrence every mechanism of this series is: $S_t = S_{t-1} G_t + v_t k_t^\top$,
# $y_t = S_t q_t$, with a state $S$ of shape [value, key] and a transition $G_t$ on the key side. Mamba's scan is a
# rung of it, one head per inner channel $d$. Read the state index $n$ as the key channel, and channel $d$'s input as
# a value of size 1:
#
# $$G_t = \mathrm{diag}\big(e^{\Delta_t[d] A[d]}\big), \qquad k_t = \Delta_t[d]\, B_t, \qquad q_t = C_t, \qquad
# v_t = u_t[d] .$$
#
# So $B$ is the key that writes the token into the state, $C$ the query that reads it, and $\Delta$ both the decay's
# step and the key's gain: a per-channel, per-step diagonal transition, like RWKV-4's decay (notebook 02) but chosen
# by the token. `family.selective_scan_via_wkv7` runs it through RWKV-7's `wkv7` in exactly this reading.
#
# **SSD, Mamba-2's rung.** Mamba-2 (Dao and Gu 2024, "Transformers are SSMs", arXiv:2405.21060) makes the decay a
# scalar: one $A$ per head, and one step $\Delta_t$ per head and token, shared by the head's value channels. Then
# $G_t = a_t I$ with $a_t = e^{\Delta_t A}$: the whole state of a head decays at one rate, $S_t = a_t S_{t-1} +
# x_t (\Delta_t B_t)^\top$ (`family.ssd`). That is the restriction that lets Mamba-2 compute a chunk as a masked
# matrix product, attention-like, on tensor cores. Below: Mamba's scan against the family's rung, and a head of
# Mamba's scan with a shared $\Delta$ and a scalar $A$ against `family.ssd`.

# %%
H_ssd, P_ssd = 2, N_st                                 # heads, value channels per head (SSD's state is P x N)
delta_head = np.log1p(np.exp(rng.standard_normal((batch, H_ssd, T_seq))))   # one step per head and token
A_head = -np.exp(rng.standard_normal(H_ssd))                                 # one A per head
x_ssd = rng.standard_normal((batch, H_ssd * P_ssd, T_seq))                   # the value channels, head-major
as_channels = dict(delta=np.repeat(delta_head, P_ssd, axis=1),              # the same, written per channel:
                   A=np.repeat(A_head, P_ssd)[:, None] * np.ones((1, N_st)))  # A[d, n] = A of d's head
per_head = lambda a: a.reshape(batch, H_ssd, P_ssd, T_seq).transpose(0, 3, 1, 2)   # (batch, T, H, P)
keys = (delta_head[:, :, None, :] * B_s[:, None]).transpose(0, 3, 1, 2)        # k_t = Delta_t B_t: (batch, T, H, N)
queries = np.broadcast_to(C_s.transpose(0, 2, 1)[:, :, None, :], keys.shape)

# %% tags=["nbval-check-output"]
check("reference.selective_scan vs family.selective_scan_via_wkv7 (the per-channel rung)",
      ref.selective_scan(u_s, delta_s, A_s, B_s, C_s)[0],
      family.selective_scan_via_wkv7(u_s, delta_s, A_s, B_s, C_s), REFERENCE_BUDGET)
y_ssd = family.ssd(queries, keys, per_head(x_ssd), (delta_head * A_head[:, None]).transpose(0, 2, 1))[0]
check("Mamba's scan with one Delta and one scalar A per head vs family.ssd",
      ref.selective_scan(x_ssd, as_channels["delta"], as_channels["A"], B_s, C_s)[0],
      y_ssd.transpose(0, 2, 3, 1).reshape(batch, H_ssd * P_ssd, T_seq), REFERENCE_BUDGET)

# %% [markdown]
# ## 7. The Mamba block (Algorithm 2)
#
# The notes' Algorithm 2 turns the scan into a layer. A block maps the residual stream $x^{(l-1)}$ (the notes'
# $T_{l-1}$), one vector of $C$ numbers per token, to $x^{(l)}$ of the same shape:
#
# ![The Mamba block: RMSNorm, in_proj into x and z; x through the causal conv1d and SiLU into x', which x_proj turns
# into dt_low, B, C and dt_proj and softplus into Delta; the scan of x' with A, Delta, B, C, D gives y; y times
# SiLU(z), out_proj, added to the residual stream](images/mamba_block.png)
#
# Green boxes carry state from token to token: the convolution's window and the scan's $h$; `*` is the elementwise
# product.
#
# Inside the block the channels are widened to $D = 2C$ (Mamba's `expand = 2`; the notes' $P$), and the state of
# every channel has $N$ entries (the notes' $K$; they use $N$ for the sequence length). As in Mamba and the notes,
# the scan's input is written $x'$ here (it was $u$ above) and its state $h$ (it was $x$). The tensors below carry
# the names of transformers' `MambaModel`, so a state dict of it loads as is; the sizes are tiny and all different:
# vocabulary $V = 20$, $C = 8$, $D = 16$, $N = 4$, a convolution of width $K = 4$, a step-size rank $R = 2$, and
# $M = 2$ blocks. The weights are random, at scales where every part matters ($A$ from $-0.5$ to $-8$, steps around
# $\mathrm{softplus}(-2)$).

# %%
V_vocab, C_model, D_inner, N_state, K_conv, R_rank, M_blocks = 20, 8, 16, 4, 4, 2, 2

def block_shapes(i):
    # One block's tensors, named as in transformers' MambaModel (Linear weights are (out, in)).
    mixer = {"in_proj.weight": (2 * D_inner, C_model), "conv1d.weight": (D_inner, 1, K_conv),
             "conv1d.bias": (D_inner,), "x_proj.weight": (R_rank + 2 * N_state, D_inner),
             "dt_proj.weight": (D_inner, R_rank), "dt_proj.bias": (D_inner,),
             "A_log": (D_inner, N_state), "D": (D_inner,), "out_proj.weight": (C_model, D_inner)}
    mixer = {f"layers.{i}.mixer.{n}": s for n, s in mixer.items()}
    return {f"layers.{i}.norm.weight": (C_model,), **mixer}

def draw(name, shape):
    if name.endswith(("norm.weight", "norm_f.weight")):
        return 1.0 + 0.2 * rng.standard_normal(shape)
    if name.endswith("A_log"):
        return np.log(rng.uniform(0.5, 8.0, shape))  # A = -exp(A_log) in (-8, -0.5)
    if name.endswith("dt_proj.bias"):
        return -2.0 + 0.5 * rng.standard_normal(shape)
    if name.endswith((".D", "embeddings.weight")):
        return rng.standard_normal(shape)
    if name.endswith("conv1d.bias"):
        return 0.2 * rng.standard_normal(shape)
    # Linear (out, in), conv1d (D, 1, K)
    return rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))

shapes = {"embeddings.weight": (V_vocab, C_model), **block_shapes(0), **block_shapes(1),
          "norm_f.weight": (C_model,)}
params = {name: draw(name, shape) for name, shape in shapes.items()}
block0 = {n[len("layers.0."):]: a for n, a in params.items() if n.startswith("layers.0.")}
# (B, T) = (2, 12)
ids = np.array([[3, 7, 1, 4, 3, 7, 1, 4, 9, 3, 7, 1], rng.integers(0, V_vocab, 12)])
Bsz, T_tok = ids.shape
hidden0 = params["embeddings.weight"][ids]                             # x^(0) = E[ids]: (B, T, C)
for name, a in block0.items():
    print(f"layers.0.{name:24s} {a.shape}")

# %% [markdown]
# ### 7.1 The norm
#
# $$\mathrm{RMSNorm}(x_t) = \frac{x_t}{\sqrt{\frac{1}{C}\sum_{c} x_{t,c}^2 + \epsilon}} \odot g$$
#
# per token, with a learned gain $g$ (`layers.l.norm.weight`) and $\epsilon = 10^{-5}$. **Erratum 14.** The notes'
# step 1 says "layer normalization". Mamba uses RMSNorm: no mean is subtracted and no bias added, so the two differ
# whenever a token's channels do not average to zero. Checked against torch's own `rms_norm`:

# %%
def rms_norm(x, g, eps=1e-5):
    return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * g          # (B, T, C)

normed = rms_norm(hidden0, block0["norm.weight"])
centered = hidden0 - hidden0.mean(-1, keepdims=True)
layer_normed = centered / np.sqrt(centered.var(-1, keepdims=True) + 1e-5) * block0["norm.weight"]
print(f"a layer norm instead: rel. difference {rel_rms(layer_normed, normed):.2f}")

# %% tags=["nbval-check-output"]
torch_rms = torch.nn.functional.rms_norm(torch.tensor(hidden0), (C_model,),
                                         torch.tensor(block0["norm.weight"]), eps=1e-5)
check("RMSNorm vs torch.nn.functional.rms_norm (float64)", normed, torch_rms, REFERENCE_BUDGET)

# %% [markdown]
# ### 7.2 Two projections
#
# $$\begin{pmatrix} x_t \\ z_t \end{pmatrix} = W_{\text{in}}\ \mathrm{RMSNorm}\big(x^{(l-1)}_t\big), \qquad
# W_{\text{in}} \in \mathbb{R}^{2D \times C} .$$
#
# The notes' $\mathrm{Linear}^x$ and $\mathrm{Linear}^z$ are the two halves of one matrix, `in_proj`: the first $D$
# outputs are the branch that goes through the scan, the other $D$ the gate. From here on the block works
# channel-first, $(B, D, T)$, the layout of the scan.

# %%
def in_proj(p, normed):
    xz = (normed @ p["mixer.in_proj.weight"].T).transpose(0, 2, 1)           # (B, 2D, T)
    return xz[:, :D_inner], xz[:, D_inner:]                                  # x, z: (B, D, T) each

x_in, z_gate = in_proj(block0, normed)

# %% [markdown]
# ### 7.3 The causal convolution
#
# $$x'_{t,d} = \mathrm{SiLU}\Big(b_d + \sum_{j=0}^{K-1} W_{d,j}\ x_{t-K+1+j,\,d}\Big), \qquad
# \mathrm{SiLU}(s) = s\,\sigma(s) .$$
#
# Each channel $d$ has its own $K$ weights (a *depthwise* convolution) and sees only its own past and present
# (*causal*). The $K - 1$ inputs before the first token come from a window carried in the state: zeros at the start
# of a text, the last $K - 1$ inputs of the previous piece otherwise. Checked against torch's `conv1d` with $K - 1$
# zeros of padding on the left:

# %%
def silu(s):
    return s / (1 + np.exp(-s))

def conv_silu(p, x_in, window):
    # window: the K - 1 inputs before the first token (B, D, K - 1); returns x' and the new window.
    padded = np.concatenate([window, x_in], axis=-1)                         # (B, D, K - 1 + T)
    W, T_ = p["mixer.conv1d.weight"], x_in.shape[-1]
    conv = p["mixer.conv1d.bias"][:, None] + sum(W[:, 0, j, None] * padded[..., j:j + T_]
                                                 for j in range(K_conv))
    return silu(conv), padded[..., T_:]  # (B, D, T), (B, D, K - 1)

x_conv, window0 = conv_silu(block0, x_in, np.zeros((Bsz, D_inner, K_conv - 1)))

# %% tags=["nbval-check-output"]
conv_weight, conv_bias = (torch.tensor(block0[f"mixer.conv1d.{n}"]) for n in ("weight", "bias"))
# torch pads K - 1 zeros on both sides: the first T outputs are the causal ones.
torch_conv = torch.nn.functional.conv1d(torch.tensor(x_in), conv_weight, conv_bias,
                                        padding=K_conv - 1, groups=D_inner)[..., :T_tok]
check("causal depthwise conv1d + SiLU vs torch's conv1d", x_conv,
      torch.nn.functional.silu(torch_conv), REFERENCE_BUDGET)
check("the new window: the last K - 1 inputs", window0, x_in[..., -(K_conv - 1):], REFERENCE_BUDGET)

# %% [markdown]
# ### 7.4 The parameters function (Algorithm 1)
#
# $$\big(\delta^{\text{low}}_t,\ B_t,\ C_t\big) = W_x\, x'_t, \qquad
# \Delta_t = \mathrm{softplus}\big(W_\Delta\, \delta^{\text{low}}_t + b_\Delta\big), \qquad A = -e^{A_{\log}} .$$
#
# The notes' lines 1 to 3 are $B = \mathrm{Linear}^B(x')$, $C = \mathrm{Linear}^C(x')$ and
# $\Delta = \mathrm{softplus}(\mathrm{Linear}^\Delta(x') + \mathrm{Parameter}^\Delta)$. In Mamba the three maps share
# one matrix, `x_proj` ($R + 2N$ outputs), and $\mathrm{Linear}^\Delta$ is low rank: `x_proj`'s first $R$ outputs
# ($R$ = `time_step_rank`, $\lceil C/16 \rceil$ by default) go through `dt_proj` ($D \times R$) back to $D$ channels,
# and $\mathrm{Parameter}^\Delta$ is `dt_proj`'s bias. $B_t$ and $C_t$ have $N$ entries per token, shared by the $D$
# channels; $\Delta_t$ has one step per channel. All three are made from the token's own $x'_t$: the *selection*.
#
# Line 4 is $\mathrm{Parameter}^A$, one row of $N$ numbers per channel. **Erratum 15.** The notes give it no sign.
# Mamba stores $A_{\log}$ and uses $A = -e^{A_{\log}}$, so every $A$ is negative whatever training does, and
# $e^{\Delta A} \in (0, 1)$ is a decay; a positive $A$ would make the state grow. (The notes also leave out the skip
# $D$ of the next step.) Lines 5 and 6, $\bar A = e^{\Delta A}$ (the exponential restored, erratum 12) and
# $\bar B = \Delta B$, happen inside the scan.

# %%
def parameters_function(p, x_conv):
    # Delta (B, D, T), A (D, N), B and C (B, N, T), all from x' (B, D, T).
    dt_low, B_t, C_t = np.split(x_conv.transpose(0, 2, 1) @ p["mixer.x_proj.weight"].T,
                                [R_rank, R_rank + N_state], axis=-1)  # (B, T, R), (B, T, N) x 2
    # (B, T, D)
    delta = softplus(dt_low @ p["mixer.dt_proj.weight"].T + p["mixer.dt_proj.bias"])
    A = -np.exp(p["mixer.A_log"])                                            # (D, N), all < 0
    return delta.transpose(0, 2, 1), A, B_t.transpose(0, 2, 1), C_t.transpose(0, 2, 1)

delta0, A0_sel, B0_sel, C0_sel = parameters_function(block0, x_conv)
print(f"steps Delta in [{delta0.min():.3f}, {delta0.max():.3f}]; "
      f"A in [{A0_sel.min():.2f}, {A0_sel.max():.2f}]")

# %% [markdown]
# **How Mamba starts $A$ (and why not at random).** This notebook draws $A$ uniform in $(-8, -0.5)$, to exercise the
# code. Mamba does not: every channel starts from the same real diagonal $A_n = -(n + 1)$, $n = 0..N-1$, which is
# S4D-Real (Gu, Gupta, Goel and Ré 2022, "On the parameterization and initialization of diagonal state space
# models", arXiv:2206.11893). Its entries are the diagonal of HiPPO-LegS's matrix, the $A$ that S4 derived so that
# the state holds the coefficients of the past projected on Legendre polynomials (the Annotated S4 gives this its
# own chapter). What it buys: the $N$ modes decay at the rates $1, 2, \dots, N$, time scales spread evenly from $1$
# down to $1/N$, and the step size $\Delta$ (started log-uniform in $[0.001, 0.1]$ per channel) turns them into
# memories of $1/(\Delta |A_n|)$ tokens. Every channel gets the whole spread, from about half a token to a thousand,
# deterministically; a uniform draw gives each channel a few rates at random, in a range fixed by the draw. The
# project's `MambaModel` starts from S4D-Real too (`models/mamba.py`), and so did its trained model (section 9).

# %%
N_real = 16                                            # Mamba's default state size
A_s4d = -np.arange(1, N_real + 1)                       # S4D-Real: A_n = -(n + 1)
fig, ax = plt.subplots(figsize=(8, 3.4), constrained_layout=True)
for dt_init, style in ((0.001, "-"), (0.01, "--"), (0.1, ":")):
    ax.semilogy(np.arange(N_real), 1 / (dt_init * -A_s4d), "C0", ls=style, label=rf"S4D-Real, $\Delta$ = {dt_init:g}")
drawn_A = -np.exp(params["layers.0.mixer.A_log"])      # this notebook's uniform draw, (D, N)
ax.semilogy(np.tile(np.arange(N_state), D_inner), 1 / (0.01 * -np.sort(drawn_A)[:, ::-1].ravel()), "C1.", ms=4,
            label=r"this notebook's uniform draw, $\Delta$ = 0.01 (each channel's N = 4)")
ax.set_xlabel("state index n")
ax.set_ylabel(r"memory $1 / (\Delta |A_n|)$ (tokens)")
ax.set_title(r"S4D-Real's $A_n = -(n+1)$: every channel gets the same spread of time scales")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# ### 7.5 The scan, with the skip
#
# $$h_t = e^{\Delta_t A} \odot h_{t-1} + \Delta_t\, B_t\, x'_t, \qquad y_t = C_t \cdot h_t + D \odot x'_t$$
#
# Section 6's scan, started from a state $h$ (zeros at the start of a text) and with Mamba's skip $D$ (`mixer.D`:
# here $D$ is a vector of $D$ numbers, one per channel; the crosswalk lists the clash).

# %%
def scan_from(h, x_conv, delta, A, B, C, D_skip):
    # h (B, D, N); x_conv, delta (B, D, T); B, C (B, N, T) -> y (B, D, T), the last h.
    y = np.empty_like(x_conv)
    for t in range(x_conv.shape[-1]):
        step = delta[..., t, None]                                           # (B, D, 1)
        h = np.exp(step * A) * h + step * B[:, None, :, t] * x_conv[..., t, None]
        y[..., t] = (h * C[:, None, :, t]).sum(-1) + D_skip * x_conv[..., t]
    return y, h

h_start = np.zeros((Bsz, D_inner, N_state))  # h before the first token
y0, h0 = scan_from(h_start, x_conv, delta0, A0_sel, B0_sel, C0_sel, block0["mixer.D"])

# %% [markdown]
# ### 7.6 The gate, the output projection, the residual
#
# $$x^{(l)} = x^{(l-1)} + W_{\text{out}}\big(y \odot \mathrm{SiLU}(z)\big), \qquad
# W_{\text{out}} \in \mathbb{R}^{C \times D} .$$
#
# The gate branch $z$ of step 7.2 scales each channel of the scan's output; `out_proj` brings the $D$ channels back
# to $C$; the block's input is added back (the notes' $\mathrm{Linear}^T$ and residual). Then the six steps as one
# block, against `reference.mamba.mixer` (which the reference model runs after its RMSNorm), output and state:

# %%
def gate_out(p, y, z):
    return (y * silu(z)).transpose(0, 2, 1) @ p["mixer.out_proj.weight"].T    # (B, T, C)

def mamba_block(p, hidden, state):
    # x^(l) from x^(l-1) (B, T, C); state = (conv window (B, D, K - 1), h (B, D, N)) -> (x^(l),
    # state).
    window, h = state
    x_in, z = in_proj(p, rms_norm(hidden, p["norm.weight"]))
    x_conv, window = conv_silu(p, x_in, window)
    y, h = scan_from(h, x_conv, *parameters_function(p, x_conv), p["mixer.D"])
    return hidden + gate_out(p, y, z), (window, h)

zero_state = (np.zeros((Bsz, D_inner, K_conv - 1)), np.zeros((Bsz, D_inner, N_state)))
hidden1, (window1, h1) = mamba_block(block0, hidden0, zero_state)
mixer0 = {n[len("mixer."):]: a for n, a in block0.items() if n.startswith("mixer.")}
ref_normed = ref_mamba.rms_norm(hidden0, block0["norm.weight"], eps=1e-5)
ref_out, (ref_window, ref_h) = ref_mamba.mixer(mixer0, ref_normed, zero_state)

# %% tags=["nbval-check-output"]
for what, actual, expected in (
    ("block 0 written out vs x + reference.mamba.mixer(RMSNorm(x))", hidden1, hidden0 + ref_out),
    ("block 0: the steps composed vs the block", hidden0 + gate_out(block0, y0, z_gate), hidden1),
    ("block 0: conv window of the state", window1, ref_window),
    ("block 0: SSM state h", h1, ref_h),
):
    check(what, actual, expected, REFERENCE_BUDGET)

# %% [markdown]
# ### 7.7 Blocks stacked
#
# $$x^{(0)} = E[\text{ids}] \xrightarrow{\text{block } 1} x^{(1)} \xrightarrow{\text{block } 2} \cdots
# \xrightarrow{\text{block } M} x^{(M)}, \qquad \text{output} = \mathrm{RMSNorm}_f\big(x^{(M)}\big) .$$
#
# The notes draw this chain, each block "extracting more abstract information". Their $M$ counts blocks here, while in
# their kernel $\bar K$ (section 5) it was the sequence length. A language model then reads logits as
# $\text{output}\cdot E^\top$ (the embedding matrix reused: tied, transformers' default). The whole stack, against
# `reference.mamba.forward`:

# %%
def mamba_forward(params, ids, state=None):
    # (output (B, T, C), state: one (conv window, h) per block).
    state = state or [zero_state] * M_blocks
    hidden, new_state = params["embeddings.weight"][ids], []
    for i, layer_state in enumerate(state):
        p = {n[len(f"layers.{i}."):]: a for n, a in params.items() if n.startswith(f"layers.{i}.")}
        hidden, layer_state = mamba_block(p, hidden, layer_state)
        new_state.append(layer_state)
    return rms_norm(hidden, params["norm_f.weight"]), new_state

output, state_end = mamba_forward(params, ids)
ref_output, ref_state_end = ref_mamba.forward(params, ids)

# %% tags=["nbval-check-output"]
check("the stack of M = 2 blocks vs reference.mamba.forward: output", output, ref_output,
      REFERENCE_BUDGET)
for i, ((w_i, h_i), (rw_i, rh_i)) in enumerate(zip(state_end, ref_state_end)):
    check(f"block {i} state (conv window, h)", np.concatenate([w_i.ravel(), h_i.ravel()]),
          np.concatenate([rw_i.ravel(), rh_i.ravel()]), REFERENCE_BUDGET)

# %% [markdown]
# ### 7.8 The state: a text in pieces
#
# Only two things link a token to earlier ones, in every block: the convolution's window (the last $K - 1$ inputs
# $x$, $(B, D, K - 1)$) and the scan's $h$ $(B, D, N)$. Carry both, and a text fed in pieces gives what it gives fed
# whole; this is how a prompt is read once and then continued token by token. Cut at 5 and 6 (pieces of 5, 1, 6):

# %%
pieces, piece_state = [], None
for part in np.split(ids, [5, 6], axis=1):
    piece_out, piece_state = mamba_forward(params, part, piece_state)
    pieces.append(piece_out)

# %% tags=["nbval-check-output"]
check("pieces 5 + 1 + 6 with the state vs whole: output", np.concatenate(pieces, axis=1), output,
      REFERENCE_BUDGET)
for i, ((w_i, h_i), (rw_i, rh_i)) in enumerate(zip(piece_state, state_end)):
    check(f"pieces vs whole: block {i} state", np.concatenate([w_i.ravel(), h_i.ravel()]),
          np.concatenate([rw_i.ravel(), rh_i.ravel()]), REFERENCE_BUDGET)

# %% [markdown]
# **Independent evidence.** The block above and `reference/mamba.py` are two readings of the same sources by the
# same project. transformers' `MambaModel` is a third, the one most people run; it takes these weights as they are
# (its fp32 CPU path). The cell skips, with a message, where transformers is not installed (it is a test
# dependency of this project; `tests/models/test_models_mamba.py` compares the two at length).

# %%
try:
    with warnings.catch_warnings():                     # tqdm's notice about Jupyter widgets
        warnings.simplefilter("ignore")
        import transformers
except ImportError:
    transformers = None
    print("transformers is not installed: skipped (tests/models/test_models_mamba.py compares against it)")
if transformers is not None:
    transformers.logging.set_verbosity_error()
    config = transformers.MambaConfig(vocab_size=V_vocab, hidden_size=C_model, state_size=N_state,
                                      num_hidden_layers=M_blocks, expand=2, conv_kernel=K_conv,
                                      time_step_rank=R_rank)
    peer = transformers.MambaModel(config).eval()
    peer.load_state_dict({n: torch.tensor(a, dtype=torch.float32) for n, a in params.items()})
    with torch.no_grad():
        theirs = peer(torch.as_tensor(ids)).last_hidden_state
    check("transformers' MambaModel (fp32) vs the stack written here", theirs, output, FP32_BUDGET)

# %% [markdown]
# **Handing the state across calls in transformers.** transformers keeps the same two things per block, in a cache
# object: call the model with `use_cache=True` and it returns `cache` (`cache_params` up to release 5.23; 5.25 still
# takes the old name with a deprecation warning); pass that back as `cache=` with the next token and the model
# continues from it, one token per call, as `generate` does. In the 5.x releases the cache is a `DynamicCache` whose
# per-layer `get_conv_state(layer, state_idx=0)` and
# `get_recurrent_state(layer, state_idx=0)` are the convolution window and $h$. Releases 4.x named it `MambaCache`,
# with `conv_states` and `ssm_states`, and also wanted `cache_position` (the position of the next token: 0 for the
# prompt, then the prompt's length and on), whose first entry told the mixer whether to start a new state or step
# the cached one. One difference of layout: transformers' window holds the last $K$ inputs, this notebook's the last
# $K - 1$ (the oldest of transformers' $K$ is never read again). The cell reads the first 5 tokens, then one token at
# a time with the cache, against the stack of 7.8 fed the same way (and its state).

# %% tags=["nbval-check-output"]
if transformers is not None:
    CACHE = "cache" if "cache" in inspect.signature(peer.forward).parameters else "cache_params"   # the release's name
    with torch.no_grad():
        prompt_run = peer(torch.as_tensor(ids[:, :5]), use_cache=True)
        cache, steps_out = getattr(prompt_run, CACHE), [prompt_run.last_hidden_state]
        after_prompt = [(cache.get_conv_state(i, state_idx=0).clone(),          # (B, D, K): the cache is updated
                         cache.get_recurrent_state(i, state_idx=0).clone())     # in place by the calls below
                        for i in range(M_blocks)]
        for t in range(5, T_tok):                                  # then one token a call, the cache handed on
            step_run = peer(torch.as_tensor(ids[:, t:t + 1]), **{CACHE: cache}, use_cache=True)
            cache = getattr(step_run, CACHE)
            steps_out.append(step_run.last_hidden_state)
    check("transformers, 5 tokens then one at a time with its cache, vs the stack whole",
          torch.cat(steps_out, dim=1), output, FP32_BUDGET)
    prompt_state = mamba_forward(params, ids[:, :5])[1]           # this notebook's state after the same 5 tokens
    for i, ((window_i, h_i), (theirs_window, theirs_h)) in enumerate(zip(prompt_state, after_prompt)):
        check(f"block {i}: transformers' conv state[..., 1:] vs the window", theirs_window[..., 1:], window_i,
              FP32_BUDGET)
        check(f"block {i}: transformers' recurrent state vs h", theirs_h, h_i, FP32_BUDGET)

# %% [markdown]
# ## 8. Selection at work
#
# In section 6 $\Delta$, $B$ and $C$ were drawn at random. In the block they are made from the input, so they depend
# on the token: below, block 0's step sizes and $B_t$ for the first text, whose tokens 3, 7, 1, 4 repeat. A token's
# $x'_t$ depends on itself and the $K - 1 = 3$ tokens before it (the convolution), so the token at position 7 (a 4
# after 3, 7, 1) gets exactly the $\Delta$, $B$, $C$ of position 3, while position 4 (a 3 after 7, 1, 4, not after
# the zeros of the start) does not match position 0.

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), constrained_layout=True)
for ax, (name, values) in zip(axes, ((r"step size $\Delta_t$ per channel", delta0[0]),
                                     (r"$B_t$ (shared by the channels)", B0_sel[0]))):
    cmap = "viridis" if name.startswith("step") else "RdBu_r"
    image = ax.imshow(values, aspect="auto", cmap=cmap)
    ax.set_yticks(range(0, len(values), max(1, len(values) // 8)))
    ax.set_xticks(range(T_tok), [f"{tok}" for tok in ids[0]])
    ax.set_xlabel("token id at each position")
    ax.set_ylabel("channel" if name.startswith("step") else "state index $n$")
    ax.set_title(name, fontsize=10)
    fig.colorbar(image, ax=ax)
fig.suptitle("Block 0, first text: made from each token and the 3 before it")
plt.show()

# %% tags=["nbval-check-output"]
same = [np.allclose(x[0, ..., 7], x[0, ..., 3], rtol=0, atol=1e-12)
        for x in (delta0, B0_sel, C0_sel)]
print("position 7 gets the Delta, B, C of position 3 (same 4 tokens in the window):", all(same))
print("position 4 differs from position 0 (the window starts with zeros at 0):",
      not np.allclose(delta0[0, :, 4], delta0[0, :, 0]))

# %% [markdown]
# **Why it matters: ignoring what does not count.** A time-invariant SSM forgets at a fixed rate: whatever came in
# $n$ tokens ago is weighed by $\bar A^n$, whether those tokens mattered or not. A selective one can choose, token by
# token. Take a text of *content* tokens, which carry a value to remember, and *filler* tokens, which carry noise.
# Give each token the features $x'_t = (\text{value}_t,\ \text{is\_filler}_t,\ 1)$ and set Algorithm 1's maps by hand
# (a trained Mamba learns maps of this kind; these are chosen to show the mechanism):
#
# $$\Delta_t = \mathrm{softplus}\big(w_\Delta \cdot x'_t\big),\ w_\Delta = (0, -12, 1), \qquad B_t = C_t = 1
# \ (\text{they read the constant feature}), \qquad A = -1 .$$
#
# A content token gets $\Delta = \mathrm{softplus}(1) = 1.31$: it mostly replaces the state with its value. A filler
# gets $\Delta = \mathrm{softplus}(-11) \approx 2 \cdot 10^{-5}$: $e^{\Delta A} \approx 1$ keeps the state, and
# $\Delta B \approx 0$ writes nothing. The time-invariant comparison uses the content step $1.31$ for every token.
# Both run through `reference.ssm.selective_scan`, one channel scanning the value feature.

# %%
def filler_demo_scan(values, is_filler, selective=True):
    # One text through the scan; Delta, B, C made from x'_t = (value, is_filler, 1) by Algorithm
    # 1's maps.
    features = np.stack([values, is_filler, np.ones_like(values)])  # (3, T): x'_t per column
    w_delta = np.array([0.0, -12.0 if selective else 0.0, 1.0])
    delta = softplus(w_delta @ features)[None, None]                    # (1, 1, T)
    B_C = (np.array([0.0, 0.0, 1.0]) @ features)[None, None]  # (1, 1, T): reads the constant 1
    # y (T,)
    return ref.selective_scan(values[None, None], delta, -np.ones((1, 1)), B_C, B_C)[0][0, 0]

def text(n_filler):
    # A content token (value 1), n noisy fillers, then a content token of value 0.
    values = np.concatenate([[1.0], 0.5 * rng.standard_normal(n_filler), [0.0]])
    return values, np.r_[0.0, np.ones(n_filler), 0.0]

def content_response(values, is_filler, selective):
    # What the first token contributes to y after the fillers: the scan is linear in the values.
    without = np.r_[0.0, values[1:]]
    y_with, y_without = (filler_demo_scan(v, is_filler, selective) for v in (values, without))
    return (y_with - y_without)[-2]  # just before the last token

memory = {"selective": [], "time-invariant": []}
for n in range(0, 21):
    values, is_filler = text(n)
    memory["selective"].append(content_response(values, is_filler, True))
    memory["time-invariant"].append(content_response(values, is_filler, False))

# %%
values, is_filler = text(12)
fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), constrained_layout=True)
axes[0].step(range(len(values)), values, where="mid", color="grey", lw=0.8, label="input value")
for kind, selective in (("selective", True), ("time-invariant", False)):
    axes[0].plot(filler_demo_scan(values, is_filler, selective), marker=".",
                 label=f"output $y_t$, {kind}")
axes[0].set_xlabel("position $t$ (content at 0, fillers 1 to 12)")
axes[0].set_title("one text: the output through the fillers")
axes[0].legend(fontsize=8)
for kind, response in memory.items():
    axes[1].semilogy(range(0, 21), np.abs(response), marker="o", label=kind)
axes[1].set_xlabel("number of filler tokens after the content token")
axes[1].set_ylabel("part of the output due to token 0")
axes[1].set_title("how much of the content survives")
axes[1].legend()
plt.show()

# %% tags=["nbval-check-output"]
kept = np.array(memory["selective"]) / memory["selective"][0]
print("selective: the content survives 20 fillers (within 0.1%):",
      bool(np.abs(kept - 1).max() < 1e-3))
print("time-invariant: less than 1e-9 of it is left after 20 fillers:",
      bool(abs(memory["time-invariant"][-1] / memory["time-invariant"][0]) < 1e-9))

# %% [markdown]
# ## 9. What a trained Mamba learned
#
# Every weight above was drawn or set by hand. The project also trains a Mamba of its own: a byte-level language
# model (vocabulary 256, one token per byte) trained on the Python standard library's `.py` sources by
# `python -m seqmix.experiments.language_model` (its docstring gives the sizes and the protocol; its report,
# `experiments/results/language_model.md`, the losses). It ships as transformers writes a `MambaForCausalLM`: a
# directory with `config.json`, `model.safetensors` (fp16, with $A_{\log}$, $D$ and $\Delta$'s bias kept fp32) and a
# `tokenizer.json` whose ids are the byte values. [`MambaForCausalLM.from_pretrained`](../models/mamba/__init__.py) reads it
# without transformers; it is checked first against `reference.mamba.forward` on the same stored values.
#
# Section 8 showed what a step size can do: $\Delta_t$ large *opens* a channel (the state is mostly replaced by the
# token, $e^{\Delta_t A} \to 0$, $\Delta_t B_t$ large), $\Delta_t$ small *closes* it (the token is skipped, the state
# kept). Here the trained model reads a few lines of real Python; each block's input is caught on its way into the
# mixer (a forward pre-hook on `layers[i].mixer`: the RMS-normed $x$), and section 7.4's parameters function, from
# the empty state, gives $\Delta_t = \mathrm{softplus}(W_\Delta\, \delta^{\text{low}}_t + b_\Delta)$ for every
# token and channel. The check cell also runs the block's scan with exactly these $\Delta_t$ and finds the
# reference's mixer output, so the $\Delta$ plotted is the one the block uses.

# %%
from pathlib import Path

from matplotlib.colors import LogNorm

from seqmix.models.mamba import MambaForCausalLM

REPO = Path(seqmix.kernels.__file__).resolve().parents[1]
LM_WEIGHTS = REPO / "experiments" / "results" / "weights" / "language_model"

lm_mamba = MambaForCausalLM.from_pretrained(LM_WEIGHTS / "mamba", dtype=torch.float32).eval()
lm_config = lm_mamba.config
print(f"trained Mamba: C = {lm_config.hidden_size}, D = {lm_config.intermediate_size}, N = {lm_config.state_size}, "
      f"{lm_config.num_hidden_layers} blocks, V = {lm_config.vocab_size}, "
      f"{sum(p.numel() for p in lm_mamba.parameters()):,} parameters")

lm_source = "import os\n\ndef read(path):\n    with open(path) as f:\n        return f.read()\n"
lm_ids = np.array([lm_mamba.tokenizer.encode(lm_source)])                 # (1, T): the bytes
mixer_inputs = {}                                                          # block -> x (1, T, C), normed

def catch(block):
    def hook(module, args):
        mixer_inputs[block] = args[0].detach().double().numpy()
    return hook

hooks = [layer.mixer.register_forward_pre_hook(catch(i)) for i, layer in enumerate(lm_mamba.backbone.layers)]
with torch.no_grad():
    lm_hidden = lm_mamba.backbone(torch.as_tensor(lm_ids), backend="torch").last_hidden_state
for h in hooks:
    h.remove()
lm_params = {name[len("backbone."):]: p.detach().double().numpy()
             for name, p in lm_mamba.state_dict().items() if name.startswith("backbone.")}
lm_ref_hidden = ref_mamba.forward(lm_params, lm_ids, eps=lm_config.layer_norm_epsilon)[0]

def selection(block):
    # Section 7's steps 7.2 to 7.4 on a trained block's mixer input, from the empty state:
    # u = x' (B, D, T), z (B, D, T), Delta (B, D, T), A (D, N), B and C (B, N, T).
    p = {n[len(f"layers.{block}.mixer."):]: a for n, a in lm_params.items() if n.startswith(f"layers.{block}.mixer.")}
    D_, N_ = p["A_log"].shape
    R_ = p["dt_proj.weight"].shape[1]
    xz = (mixer_inputs[block] @ p["in_proj.weight"].T).transpose(0, 2, 1)  # (B, 2D, T)
    empty = np.zeros((xz.shape[0], D_, p["conv1d.weight"].shape[-1] - 1))
    u = silu(ref_mamba.causal_conv1d(xz[:, :D_], p["conv1d.weight"], p.get("conv1d.bias"), empty)[0])
    dt_low, B_t, C_t = np.split(u.transpose(0, 2, 1) @ p["x_proj.weight"].T, [R_, R_ + N_], axis=-1)
    delta = softplus(dt_low @ p["dt_proj.weight"].T + p["dt_proj.bias"])   # (B, T, D)
    return dict(p=p, u=u, z=xz[:, D_:], delta=delta.transpose(0, 2, 1), A=-np.exp(p["A_log"]),
                B=B_t.transpose(0, 2, 1), C=C_t.transpose(0, 2, 1))

lm_selection = [selection(i) for i in range(lm_config.num_hidden_layers)]
lm_delta = np.stack([s["delta"][0] for s in lm_selection])                # (layers, D, T)

# %% tags=["nbval-check-output"]
check("trained Mamba (torch, fp32) vs reference.mamba.forward on its stored weights: hidden states", lm_hidden,
      lm_ref_hidden, FP32_BUDGET)
for i, s in enumerate(lm_selection):
    y_s = ref.selective_scan(s["u"], s["delta"], s["A"], s["B"], s["C"], D=s["p"]["D"], z=s["z"])[0]
    zero_block_state = (np.zeros((1,) + s["u"].shape[1:2] + (s["p"]["conv1d.weight"].shape[-1] - 1,)),
                        np.zeros((1,) + s["A"].shape))
    check(f"block {i}: the scan with the Delta plotted vs reference.mamba.mixer",
          y_s.transpose(0, 2, 1) @ s["p"]["out_proj.weight"].T,
          ref_mamba.mixer(s["p"], mixer_inputs[i], zero_block_state)[0], REFERENCE_BUDGET)
print("one step per block, channel and token:",
      lm_delta.shape == (lm_config.num_hidden_layers, lm_config.intermediate_size, lm_ids.shape[1]))
print("every step Delta > 0 and finite:", bool(np.isfinite(lm_delta).all() and (lm_delta > 0).all()))
print("every A < 0, so every e^(Delta A) is a decay within [0, 1]:",
      all(bool((s["A"] < 0).all()) for s in lm_selection))

# %%
lm_labels = [{"\n": "\u23ce", " ": "\u2423"}.get(ch, ch) for ch in lm_source]   # one label per byte-token
show_block = lm_config.num_hidden_layers - 1
fig, axes = plt.subplots(2, 1, figsize=(12, 7.5), constrained_layout=True)
for i, block_delta in enumerate(lm_delta):
    axes[0].semilogy(block_delta.mean(0), marker=".", ms=4, lw=1, color=plt.cm.viridis(i / len(lm_delta)),
                     label=f"block {i}")
axes[0].set_ylabel(r"mean of $\Delta_t$ over the $D$ channels")
axes[0].set_title(r"step size per token, every block: high = the channels open (write the token), "
                  r"low = they close (keep the state)", fontsize=10)
axes[0].legend(fontsize=7, ncol=min(8, len(lm_delta)))
image = axes[1].imshow(lm_delta[show_block], aspect="auto", cmap="viridis", interpolation="nearest",
                       norm=LogNorm())
axes[1].set_ylabel("channel $d$")
axes[1].set_title(fr"$\Delta_t$ per channel, block {show_block} (log colour scale)", fontsize=10)
fig.colorbar(image, ax=axes[1], pad=0.01)
for ax in axes:
    ax.set_xticks(range(len(lm_labels)), lm_labels, fontsize=7)
    ax.set_xlim(-0.5, len(lm_labels) - 0.5)
plt.show()

# %%
# The numbers behind the plot (not compared: they are the trained model's).
kinds = {"letters and digits": str.isalnum, "spaces": lambda ch: ch == " ", "newlines": lambda ch: ch == "\n",
         "punctuation": lambda ch: not ch.isalnum() and not ch.isspace()}
kind_of = {name: np.array([is_kind(ch) for ch in lm_source]) for name, is_kind in kinds.items()}
for i, block_delta in enumerate(lm_delta):
    mean_delta = block_delta.mean(0)                                         # (T,)
    by_kind = ", ".join(f"{name} {mean_delta[where].mean():.3g}" for name, where in kind_of.items())
    opened, closed = np.argsort(mean_delta)[::-1][:3], np.argsort(mean_delta)[:3]
    print(f"block {i}: Delta {block_delta.min():.2g} to {block_delta.max():.2g}; channel-mean by kind: {by_kind}; "
          f"most open at {[lm_labels[t] for t in opened]}, most closed at {[lm_labels[t] for t in closed]}")

# %% [markdown]
# Read the plot token by token: where a block's mean step rises, its channels take in that character and let the
# older state go; where it falls, they carry their state across the character as if it were not there (section 8's
# filler). The heatmap shows it channel by channel. Each channel has a time scale of its own: Mamba's start draws
# the biases $b_\Delta$ so that the steps spread log-uniformly from 0.001 to 0.1 across the channels (rows), and
# training moves them; the token then moves each channel's step up or down (columns). The printed lines say, per
# block, how the mean step differs between letters, spaces, newlines and punctuation, and at which characters the
# block opens and closes most.
#
# Last, the trained model continues a prompt through its state (section 7.8: the prompt is read once, then one token
# at a time), greedily, up to the end of the line. From a shell: `python -m seqmix.generate
# experiments/results/weights/language_model/mamba --prompt "def "`.

# %%
lm_prompt = "def "
lm_stream = lm_mamba.generate_text(lm_prompt, max_new_tokens=80, stop="\n")
print(repr(lm_prompt + "".join(lm_stream)))

# %% tags=["nbval-check-output"]
print("the continuation is text, one line at most:", isinstance(lm_stream.text, str) and "\n" not in lm_stream.text)
print("tokens generated, within the limit:", 0 < len(lm_stream.tokens) <= 80)

# %% [markdown]
# **And $A$?** Section 7.4 said Mamba starts every channel at S4D-Real's $A_n = -(n + 1)$, and the project's model
# did. After training, $A = -e^{A_{\log}}$ per block against that start: the median factor by which a channel's
# $|A_n|$ moved, and the range of $|A|$ (the start's is 1 to $N$).

# %%
# Not compared: these are the trained model's numbers.
for i, layer in enumerate(lm_mamba.backbone.layers):
    learned_A = -np.exp(layer.mixer.A_log.detach().double().numpy())           # (D, N)
    start_A = -np.arange(1, learned_A.shape[1] + 1)                             # S4D-Real, every channel
    moved = np.exp(np.median(np.abs(np.log(learned_A / start_A))))
    print(f"block {i}: |A| from {-learned_A.max():.2f} to {-learned_A.min():.1f} (start 1 to {learned_A.shape[1]}); "
          f"median change {moved:.2f}x")

# %% [markdown]
# As with RWKV-4's decays in notebook 03, training at this budget left $A$ close to its start (a median change of
# under 1.1x): the time scales the model has are S4D-Real's, stretched or shrunk token by token by $\Delta$ (the plot
# above), the step that multiplies them.

# %% [markdown]
# ## Summary
#
# - ZOH solves the system exactly for a held input: $\bar A = e^{\Delta A}$, $\bar B = \int_0^\Delta e^{As}ds\,B$,
#   which the augmented-matrix exponential computes even for a singular $A$; it matches the closed form and a direct
#   quadrature to float64 rounding.
# - Of the three ways to compute $e^{A}$, only scaling and squaring is safe in general: the series fails for large
#   $\|A\|$, the eigendecomposition for defective $A$.
# - Euler is first order, bilinear second order, ZOH exact for a held input (the log-log slopes 1 and 2). Euler is
#   also the only one of the three that can turn a stable system unstable ($|1 + \Delta\lambda| > 1$ at the two
#   largest steps here).
# - A time-invariant SSM is a convolution with $\bar K = (C\bar B, C\bar A\bar B, \dots)$ (with the state named
#   after the input that entered it, $x_k = \bar A x_{k-1} + \bar B u_k$); Mamba's input-dependent $\Delta, B, C$
#   make it a scan, with $\bar A = e^{\Delta A}$ and Euler's $\bar B = \Delta B$. A scan is a prefix computation,
#   not a sequential loop: its steps combine with the associative $(a, b) \circ (a', b') = (a a', a' b + b')$, so a
#   parallel scan computes it in $\log_2 T$ rounds (checked against the loop); notebook 04's chunked WY form is the
#   matrix analogue.
# - The Mamba block is RMSNorm (not a layer norm, erratum 14), `in_proj` into $x$ and $z$, a causal depthwise
#   convolution and SiLU, Algorithm 1 ($\Delta$ through a rank-$R$ map and softplus; $B$, $C$ from the same
#   `x_proj`; $A = -e^{A_{\log}} < 0$, erratum 15), the scan with the skip $D$, the gate $y \odot
#   \mathrm{SiLU}(z)$, `out_proj` and the residual. Written out step by step it matches `reference/mamba.py` and
#   transformers' `MambaModel`; stacked, with the (conv window, $h$) state, a text in pieces gives the whole.
# - In the family $S_t = S_{t-1} G_t + v_t k_t^\top$, Mamba's scan is the per-channel rung: $G_t =
#   \mathrm{diag}(e^{\Delta_t A})$, $k_t = \Delta_t B_t$, $q_t = C_t$, $v_t = x_t$; Mamba-2's SSD makes the decay one
#   scalar per head and step, $G_t = a_t I$ (both checked against `reference.family`). Mamba starts $A$ at S4D-Real's
#   $-(1, \dots, N)$, a fixed spread of time scales, not at random. transformers hands the same state across calls as
#   `cache` (checked against this notebook's window and $h$).
# - Selection: $\Delta$, $B$, $C$ depend on the token and the $K - 1$ before it; a small $\Delta$ lets the state
#   skip a token entirely, which no time-invariant SSM can do.
# - The project's own trained Mamba (a byte-level model of the standard library's sources) loads with
#   `from_pretrained` and matches `reference.mamba.forward` on its stored weights. On real Python its step sizes
#   $\Delta_t > 0$ open and close from character to character and differ from channel to channel (section 9 plots
#   them, with the scan checked to run on exactly those steps); it writes a line of Python-looking text from `"def "`.
#
# **Two tracks.** The series has two threads, and this notebook ends the first. *Recurrent state* (02 to 06, then
# 09's experiments and 12's synthesis): one recurrence $S_t = S_{t-1} G_t + v_t k_t^\top$ with a different transition
# per mechanism, RWKV-4 (02, 03), RWKV-7 (04, 05) and Mamba here. *Attention's positions* (07, then 10's
# extrapolation experiments) starts again from notebook 01: how softmax attention knows where a key is, with RoPE and
# ReRoPE. 08 (kernels) and 11 (checking your own kernel) serve both.
#
# Next: [07 · ReRoPE](07_rerope.ipynb), the second track; or [09 · recall and selection](09_recall_and_selection.ipynb)
# to stay on the first.
#
# ## Exercises
#
# Each exercise has a solution in the collapsed cell below it (click the three dots to open it); it runs with the
# notebook, so it is checked too. In a coding exercise, fill in the stub, run it, then run the check cell under it:
# it says "not attempted yet" while the stub is untouched, "correct" when your code passes, and fails with the
# checks' message otherwise.
#
# **1. The largest stable Euler step.** For which $\Delta$ is $|1 + \Delta\lambda| < 1$, for a mode
# $\lambda = \alpha + \mathrm{i}\beta$ with $\alpha < 0$? Compute the bound for every eigenvalue of this notebook's
# $A$ and compare it with the steps of section 4's plot (optional section).

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
# 1. |1 + delta lambda|^2 = (1 + delta alpha)^2 + (delta beta)^2 < 1  <=>  delta < -2 alpha / |lambda|^2.
bounds = -2 * np.linalg.eigvals(A).real / np.abs(np.linalg.eigvals(A)) ** 2
print("largest stable Euler step per mode:", np.round(np.sort(bounds), 3))
print("the plot's steps 0.25 and 0.125 exceed the smallest bound, 0.0625 does not:",
      bool(deltas[1] > bounds.min() > deltas[2]))

# %% [markdown]
# **2. How much selection is enough.** Section 8 gave the filler flag the weight $-12$ in $w_\Delta$ (the content
# weight and the constant's stay 0 and 1, $A = -1$, $B = C = 1$). Write `filler_weight_for(kept, n)`: the filler
# weight for which the content token's part of the output is still the fraction `kept` of itself after `n`
# fillers. The check runs the scan on a content token followed by `n` fillers and compares. Hint: each filler
# multiplies the state by $e^{\Delta_f A}$, and $\Delta_f = \mathrm{softplus}(w + 1)$; its inverse is
# $\ln(e^{\Delta} - 1)$. Then: how much does section 8's $-12$ keep after 20 fillers, and after 10,000?

# %%
# Exercise 2: how much selection is enough
def filler_weight_for(kept, n):
    """The filler flag's weight in w_delta that leaves the fraction `kept` of the content after n fillers."""
    raise NotImplementedError("Exercise 2: your code here")

# %% tags=["nbval-check-output"]
def content_kept(filler_weight, n):
    # The content token's part of y after n fillers over its part at once, by reference.ssm.selective_scan: the
    # content (value 1) then n fillers (value 0: the scan is linear, their own values add a separate part).
    delta = softplus(filler_weight * np.r_[0.0, np.ones(n)] + 1.0)[None, None]   # (1, 1, n + 1)
    ones = np.ones((1, 1, n + 1))
    y = ref.selective_scan(np.eye(n + 1)[None, :1], delta, -np.ones((1, 1)), ones, ones)[0][0, 0]
    return y[-1] / y[0]

def checks_2():
    for kept, n in ((0.99, 20), (0.5, 100), (0.9, 5)):
        check(f"content kept after {n} fillers with your weight, vs {kept}",
              content_kept(filler_weight_for(kept, n), n), kept, REFERENCE_BUDGET)

exercise("Exercise 2", checks_2)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
def filler_weight_for(kept, n):
    """The filler flag's weight in w_delta that leaves the fraction `kept` of the content after n fillers."""
    delta_filler = -np.log(kept) / n                 # e^{-n Delta_f} = kept (A = -1)
    return np.log(np.expm1(delta_filler)) - 1.0      # softplus(w + 1) = Delta_f; the constant's weight is 1

print(f"section 8's weight -12: kept after 20 fillers {content_kept(-12.0, 20):.6f}, "
      f"after 10,000 {content_kept(-12.0, 10_000):.3f}")
exercise("Exercise 2", checks_2)

# %% [markdown]
# **3. What the convolution remembers.** Write `windows_token_by_token(params, ids)`: feed the texts of section 7
# through `mamba_forward` one token at a time, carrying the state, and return block 0's convolution window after
# each token (a list of $T$ arrays $(B, D, K - 1)$). The check compares them with what the window should hold: the
# last $K - 1$ inputs $x$ of step 7.2 (`x_in`, before the convolution), zeros before the first token. Which part of
# `mamba_forward`'s state is block 0's window?

# %%
# Exercise 3: what the convolution remembers
def windows_token_by_token(params, ids):
    """Block 0's conv window (B, D, K - 1) after each token of ids, fed one token at a time with the state."""
    raise NotImplementedError("Exercise 3: your code here")

# %% tags=["nbval-check-output"]
def checks_3():
    padded = np.concatenate([np.zeros((Bsz, D_inner, K_conv - 1)), x_in], axis=-1)    # zeros before token 0
    expected_windows = np.stack([padded[..., t + 1:t + K_conv] for t in range(T_tok)])
    check("block 0's window after each token vs the last K - 1 inputs x_in",
          np.stack(windows_token_by_token(params, ids)), expected_windows, REFERENCE_BUDGET)

exercise("Exercise 3", checks_3)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
def windows_token_by_token(params, ids):
    """Block 0's conv window (B, D, K - 1) after each token of ids, fed one token at a time with the state."""
    windows, step_state = [], None
    for t in range(ids.shape[1]):
        _, step_state = mamba_forward(params, ids[:, t:t + 1], step_state)   # without the state: zeros every time
        windows.append(step_state[0][0])                                    # block 0's (window, h): the window
    return windows

exercise("Exercise 3", checks_3)

# %% [markdown]
# **4. The parallel scan from a carried state.** Write `parallel_scan_from(a, b, x_prev)`: the states $x_t$ of
# $x_t = a_t x_{t-1} + b_t$ for every $t$ (the last axis), starting from a state $x_{-1}$ = `x_prev` carried in from
# an earlier piece, with section 6's `hillis_steele_scan`. The check reads the outputs $y_t = C_t \cdot x_t$ off your
# states, for section 6's inputs, and compares them with `ref.selective_scan(..., state=x_prev)`. Hint: fold the
# state into the first pair. (The solution also runs `combine` with the steps in the wrong order,
# $(a, b) \circ (a', b') = (a a', a b' + b)$: the scan no longer reproduces the loop.)

# %%
# Exercise 4: the parallel scan from a carried state
def parallel_scan_from(a, b, x_prev):
    """x_t for every t (last axis) of x_t = a_t x_{t-1} + b_t with x_{-1} = x_prev, by a parallel scan."""
    raise NotImplementedError("Exercise 4: your code here")

# %% tags=["nbval-check-output"]
x_prev = pair_rng.standard_normal(u_s.shape[:2] + A_s.shape[1:])    # (batch, D, N): a state from an earlier piece

def checks_4():
    x_states = parallel_scan_from(a_pairs, b_pairs, x_prev)          # (batch, D, N, T)
    expected = ref.selective_scan(u_s, delta_s, A_s, B_s, C_s, state=x_prev)[0]
    check("outputs of your parallel scan vs reference.selective_scan(state=x_prev)",
          (x_states * C_s[:, None, :, :]).sum(axis=2), expected, REFERENCE_BUDGET)

exercise("Exercise 4", checks_4)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
def parallel_scan_from(a, b, x_prev):
    """x_t for every t (last axis) of x_t = a_t x_{t-1} + b_t with x_{-1} = x_prev, by a parallel scan."""
    b = b.copy()
    b[..., 0] += a[..., 0] * x_prev                  # x_0 = a_0 x_{-1} + b_0: the state enters the first pair's b
    return hillis_steele_scan(a, b)[0]

# The wrong order applies the later step first: not the recurrence, so the scan no longer reproduces the loop.
def combine_wrong_order(first, second):
    (a1, b1), (a2, b2) = first, second
    return a1 * a2, a1 * b2 + b1

a_w, b_w, s_w = a_pairs.copy(), b_pairs.copy(), 1
while s_w < T_seq:                                   # hillis_steele_scan's rounds, with the wrong combine
    a_w[..., s_w:], b_w[..., s_w:] = combine_wrong_order((a_w[..., :-s_w], b_w[..., :-s_w]),
                                                         (a_w[..., s_w:], b_w[..., s_w:]))
    s_w *= 2
print("wrong order vs the loop, rel. error > 10%:",
      rel_rms((b_w * C_s[:, None, :, :]).sum(axis=2), y_mamba) > 0.1)
exercise("Exercise 4", checks_4)

# %% [markdown]
# ## Appendix: the production path against the reference
#
# The rest of this notebook is not about the math: it checks that the code people run gives the reference's
# numbers. nbval runs and checks it like the cells above.
#
# ### A. The selective scan: torch, Triton and C
#
# [`kernels.ssm.selective_scan`](../kernels/ssm/__init__.py) is Mamba's scan (Euler $\bar B$) with all its options: the skip
# $D$, the gate $z$, the bias and softplus of $\Delta$, an initial state, and the last state returned. Backend
# `"torch"` runs a chunked scan; backend `"triton"` walks time in a kernel with the state in registers (here under
# the Triton interpreter on the CPU, so the shapes are small). Both are checked against `reference.ssm.selective_scan`
# on the same inputs: outputs and last states, a sequence fed in two pieces, and fp16.
#
# A third implementation, backend `"c"` ([`kernels/ssm/ssm.c`](../kernels/ssm/ssm.c)), is a compiled C loop that
# walks time once, with a backward that walks it back ([`kernels/ssm/c.py`](../kernels/ssm/c.py)): the CPU path
# for inference and training alike, which `backend=None` takes for CPU tensors whether or not a gradient is wanted.
# Every check below runs it too, gradients included, against the same reference and budgets.

# %%
from seqmix.kernels.ssm import selective_scan as scan_kernel
from seqmix.models.mamba import MambaConfig, MambaModel

batch, D_ch, N_st, T = 2, 4, 8, 24
u64, delta64, z64 = (rng.standard_normal((batch, D_ch, T)) for _ in range(3))   # (batch, D, T)
A64 = -np.exp(rng.standard_normal((D_ch, N_st)))                               # (D, N)
B64, C64 = rng.standard_normal((batch, N_st, T)), rng.standard_normal((batch, N_st, T))
D64, bias64 = rng.standard_normal(D_ch), rng.standard_normal(D_ch)             # (D,)
inputs = dict(u=u64, delta=delta64, A=A64, B=B64, C=C64, D=D64, z=z64, delta_bias=bias64)
BACKENDS = ("torch", "triton", "c")  # "c": the C loop, forward and backward
FP32_PARAMS = ("A", "D", "delta_bias")  # kept fp32, as Mamba keeps them

def run(backend, dtype=torch.float32, state=None, **arrays):
    # The kernel on float64 arrays cast to dtype.
    t = {n: torch.tensor(x, dtype=torch.float32 if n in FP32_PARAMS else dtype)
         for n, x in arrays.items()}
    return scan_kernel(**t, delta_softplus=True, state=state, backend=backend)

def fp16_rounded(x):
    return x.astype(np.float16).astype(np.float64)

expected, expected_last = ref.selective_scan(**inputs, delta_softplus=True)
split = 10
first = {n: (x[..., :split] if x.ndim == 3 else x) for n, x in inputs.items()}
rest = {n: (x[..., split:] if x.ndim == 3 else x) for n, x in inputs.items()}
rounded = {n: (x if n in FP32_PARAMS else fp16_rounded(x)) for n, x in inputs.items()}

# %% tags=["nbval-check-output"]
for backend in BACKENDS:
    y, last = run(backend, **inputs)
    check(f"{backend} fp32 y", y, expected, FP32_BUDGET)
    check(f"{backend} fp32 last state", last, expected_last, FP32_BUDGET)
    y1, state1 = run(backend, **first)
    y2, _ = run(backend, state=state1, **rest)
    check(f"{backend} fp32 fed in two pieces", torch.cat([y1, y2], dim=-1), expected, FP32_BUDGET)
    check(f"{backend} fp16 y", run(backend, dtype=torch.float16, **rounded)[0],
          ref.selective_scan(**rounded, delta_softplus=True)[0], FP16_BUDGET)


# %% [markdown]
# **Gradients.** The float64 truth for the gradients is autograd through a plain token-by-token torch loop of the
# same scan (its forward is first checked against the reference). The three backends' fp32 gradients of
# $\sum y \odot G$ with respect to all eight inputs must match it.

# %%
def scan_loop_torch(u, delta, A, B, C, D, z, delta_bias):
    # Mamba's scan token by token, in torch: a float64 autograd reference for the gradients.
    delta = torch.nn.functional.softplus(delta + delta_bias[:, None])
    x, ys = torch.zeros(u.shape[0], u.shape[1], A.shape[1], dtype=u.dtype), []
    for t in range(u.shape[2]):
        step = delta[:, :, t, None]
        x = torch.exp(step * A) * x + step * B[:, None, :, t] * u[:, :, t, None]
        ys.append((x * C[:, None, :, t]).sum(-1))
    return (torch.stack(ys, dim=-1) + D[:, None] * u) * torch.nn.functional.silu(z)

G = rng.standard_normal((batch, D_ch, T))  # upstream gradient dLoss/dy
names = list(inputs)

def gradients(fn, dtype):
    leaves = {n: torch.tensor(x, dtype=dtype, requires_grad=True) for n, x in inputs.items()}
    fn(**leaves).backward(torch.tensor(G, dtype=dtype))
    return [leaves[n].grad for n in names]

def kernel_output(backend):
    return lambda **t: scan_kernel(**t, delta_softplus=True, backend=backend)[0]

expected_grads = gradients(scan_loop_torch, torch.float64)
backend_grads = {b: gradients(kernel_output(b), torch.float32) for b in BACKENDS}

# %% tags=["nbval-check-output"]
loop64 = scan_loop_torch(**{n: torch.tensor(x) for n, x in inputs.items()})
check("token loop in torch float64 vs reference", loop64, expected, REFERENCE_BUDGET)
for backend in BACKENDS:
    for name, got, want in zip(names, backend_grads[backend], expected_grads):
        check(f"{backend} fp32 d{name}", got, want, FP32_BUDGET)

# %%
# The errors themselves (this cell is not compared: the numbers depend on the machine).
for backend in BACKENDS:
    worst = max(rel_rms(g, e) for g, e in zip(backend_grads[backend], expected_grads))
    print(f"{backend:6s} fp32: y rel. RMS error {rel_rms(run(backend, **inputs)[0], expected):.1e}, "
          f"worst gradient {worst:.1e}")

# %% [markdown]
# ### B. The torch Mamba model
#
# [`models.mamba.MambaModel`](../models/mamba/__init__.py) is the block of section 7 in torch, on this scan, with
# transformers' parameter names: the weights of section 7 load as they are (fp32). Each backend runs the texts of
# section 7 whole, and in the pieces 5 + 1 + 6 with the state carried, against the float64 stack.

# %%
model = MambaModel(MambaConfig(vocab_size=V_vocab, hidden_size=C_model, state_size=N_state,
                               num_hidden_layers=M_blocks, expand=2, conv_kernel=K_conv,
                               time_step_rank=R_rank))
model.load_state_dict({n: torch.tensor(a, dtype=torch.float32) for n, a in params.items()})

def model_in_pieces(backend):
    state, outs = None, []
    with torch.no_grad():
        for part in torch.as_tensor(ids).split([5, 1, 6], dim=1):
            result = model(part, state=state, use_cache=True, backend=backend)
            outs.append(result.last_hidden_state)
            state = result.state
    return torch.cat(outs, dim=1), state

def flat_state(state):
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for pair in state for a in pair])

# %% tags=["nbval-check-output"]
for backend in BACKENDS:
    with torch.no_grad():
        whole = model(torch.as_tensor(ids), backend=backend).last_hidden_state
    check(f"MambaModel, {backend} scan, fp32: output", whole, output, FP32_BUDGET)
    in_pieces, piece_state_t = model_in_pieces(backend)
    check(f"MambaModel, {backend} scan, fp32: in pieces", in_pieces, output, FP32_BUDGET)
    check(f"MambaModel, {backend} scan, fp32: state after the pieces", flat_state(piece_state_t),
          flat_state(state_end), FP32_BUDGET)
