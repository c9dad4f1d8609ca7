# %% [markdown]
# # 06 · State space models: zero-order hold, the convolution kernel, and Mamba's selective scan
#
# A state space model is a linear differential equation read as a sequence layer. This notebook follows the Mamba
# part of the RWKV/Mamba study notes: the continuous system; its zero-order-hold (ZOH) discretization, derived; the
# matrix exponential it needs, computed three ways (and where two of them break); ZOH against the Euler and bilinear
# discretizations, with the error of each against the step size on a log-log plot; the discrete recurrence written
# as one convolution with a kernel $\bar K$; and Mamba's selective scan, whose $\Delta$, $B$, $C$ change from token to
# token and whose $\bar B$ is Euler's, not ZOH's (the difference is shown). Then the torch path and the Triton kernel
# of the selective scan run on the same inputs and are checked against the float64 reference, outputs, states and
# gradients.
#
# **Sources.** The Mamba/SSM part of the RWKV/Mamba study notes in the source material (the order followed here;
# errata 11, 12 and 13 of [`reference/ERRATA.md`](../reference/ERRATA.md) are about it); Mamba, arXiv:2312.00752,
# https://arxiv.org/abs/2312.00752 (the selective scan, its discretization); S4, arXiv:2111.00396,
# https://arxiv.org/abs/2111.00396 (the bilinear discretization, the convolution view).
#
# **Code used.** [`reference/ssm.py`](../reference/ssm.py): `expm`, `discretize_zoh`, `discretize_zoh_diagonal`,
# `discretize_euler`, `discretize_bilinear`, `ssm_kernel`, `ssm_recurrence`, `causal_convolution`,
# `selective_scan` (NumPy, float64: the truth) · [`kernels/ssm.py`](../kernels/ssm.py): `selective_scan`
# (backend `"torch"`: a chunked scan; backend `"triton"`: a sequential-in-time kernel, forward and backward) ·
# [`kernels/testing.py`](../kernels/testing.py): `check` and the error budgets.

# %%
import seqmix

MODE = seqmix.use_interpreter_without_gpu()    # without a GPU: TRITON_INTERPRET=1, before triton is imported

import matplotlib.pyplot as plt
import numpy as np
import torch

from seqmix.kernels.ssm import selective_scan as scan_kernel
from seqmix.kernels.testing import FP16_BUDGET, FP32_BUDGET, REFERENCE_BUDGET, check, rel_rms
from seqmix.reference import ssm as ref

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
# state $h(t)$ and the input $x(t)$ in their first equations, then switch to $x$ and $u$ in the ZOH section; this
# notebook uses $x$ and $u$ throughout, as S4 does. The notes' output equation reads $y(t) = C\,h'(t)$, with the
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

B_bar_closed = np.linalg.solve(A, ref.expm(delta * A) - np.eye(N)) @ B      # A^-1 (e^{delta A} - I) B
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
check("ZOH B_bar of a singular A vs by hand", ref.discretize_zoh(A0, B0, delta)[1], B0_bar_by_hand, REFERENCE_BUDGET)
print("singular A handled: True")


# %% [markdown]
# ## 3. The matrix exponential, three ways
#
# $e^{A}$ is not the elementwise exponential of $A$. It is defined by the series
#
# $$e^{A} = \sum_{k=0}^{\infty} \frac{A^k}{k!} .$$
#
# (The notes write $\sum_{i=0}^{\infty} A^k/k!$: the summation index must be the exponent's, $k$; erratum 13.) For a
# diagonal matrix it reduces to exponentiating the diagonal, and for a diagonalizable one,
# $A = P\,\mathrm{diag}(\lambda)\,P^{-1}$, it is $e^{A} = P\,\mathrm{diag}(e^{\lambda})\,P^{-1}$. The third way, the
# one `reference.ssm.expm` uses (as do SciPy and most libraries), is *scaling and squaring*:
# $e^{A} = \left(e^{A/2^s}\right)^{2^s}$, with $s$ chosen so that $\|A/2^s\|$ is small, $e^{A/2^s}$ from a rational
# (Padé) approximant that is exact to double precision there, then $s$ squarings.

# %%
def expm_series(X, terms=60):
    # sum_{k < terms} X^k / k!, term by term.
    total, term = np.eye(len(X)), np.eye(len(X))
    for k in range(1, terms):
        term = term @ X / k                              # X^k / k!
        total = total + term
    return total

def expm_eigen(X):
    # P diag(e^lambda) P^-1 (complex in general; the imaginary parts cancel for a real X).
    lam, P = np.linalg.eig(X)
    return ((P * np.exp(lam)) @ np.linalg.inv(P)).real

X = delta * A
print("elementwise exp is something else: max |exp(X) - e^X| =", round(float(np.abs(np.exp(X) - ref.expm(X)).max()), 3))

# %% tags=["nbval-check-output"]
check("e^{delta A}: series vs scaling and squaring", expm_series(X), ref.expm(X), REFERENCE_BUDGET)
check("e^{delta A}: eigendecomposition vs scaling and squaring", expm_eigen(X), ref.expm(X), REFERENCE_BUDGET)
print("diagonal matrix, e^{diag(a)} = diag(e^a):", bool(np.allclose(ref.expm(np.diag([1.0, -2.0])), np.diag(np.exp([1.0, -2.0])))))

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
def symmetric(scale):                                                 # scale * Q diag(mu) Q^T and its exact e^.
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
print(f"symmetric, ||S|| = 60: series rel. error {rel_rms(expm_series(symmetric(10)[0]), symmetric(10)[1]):.1e}")

fig, ax = plt.subplots(figsize=(6.5, 4))
for name, errs in errors.items():
    ax.loglog(scales * 6, errs, marker="o", label=name)
ax.set_xlabel("||S||_2 (largest |eigenvalue| of the symmetric test matrix)")
ax.set_ylabel("relative RMS error of e^S")
ax.set_title("Matrix exponential: the series fails for large ||S||")
ax.legend()
plt.show()

# %% tags=["nbval-check-output"]
check("e^J (Jordan block): scaling and squaring vs exact", ref.expm(J), J_exact, REFERENCE_BUDGET)
for sc in (0.1, 1.0, 10.0):
    S, exact = symmetric(sc)
    check(f"e^S, ||S|| = {6 * sc:g}: scaling and squaring vs exact", ref.expm(S), exact, REFERENCE_BUDGET)

# %% [markdown]
# ## 4. ZOH against Euler and bilinear
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
# and 2 on a log-log plot, once $\Delta$ is small enough (for the largest steps below, Euler is barely stable on the
# oscillating mode, $|1 + \Delta\lambda| \approx 1$, so the slopes are fitted over the five smallest steps). ZOH is exact whenever the input really is held, as for the step response below (a
# constant input from a nonzero initial state), whose exact solution is
# $x(t) = e^{tA}x_0 + A^{-1}\left(e^{tA} - I\right)B$. (ZOH's error is rounding, which grows slowly with the
# number of steps: about $10^{-13}$ after ten thousand.)

# %%
t_end = 5.0
x0 = rng.standard_normal(N)
exact_end = ref.expm(t_end * A) @ x0 + np.linalg.solve(A, ref.expm(t_end * A) - np.eye(N)) @ B   # x(t_end), u = 1

steps = 20 * 2 ** np.arange(10)                                        # 20 .. 10240 steps
deltas = t_end / steps
methods = {"ZOH": ref.discretize_zoh, "Euler": ref.discretize_euler, "bilinear": ref.discretize_bilinear}
final_state = {name: [] for name in methods}
for n_steps, dt in zip(steps, deltas):
    for name, discretize in methods.items():
        Ad, Bd = discretize(A, B, dt)
        final_state[name].append(ref.ssm_recurrence(Ad, Bd, C, np.ones(n_steps), x0=x0)[1])   # x after n steps
step_errors = {name: np.array([rel_rms(x, exact_end) for x in xs]) for name, xs in final_state.items()}
small = slice(-5, None)                                                # the five smallest steps: the asymptotic regime
slopes = {name: np.polyfit(np.log(deltas[small]), np.log(step_errors[name][small]), 1)[0] for name in ("Euler", "bilinear")}
print({name: round(float(sl), 2) for name, sl in slopes.items()}, "; worst ZOH error:", f"{step_errors['ZOH'].max():.1e}")
assert abs(slopes["Euler"] - 1) < 0.1 and abs(slopes["bilinear"] - 2) < 0.1

fig, ax = plt.subplots(figsize=(6.5, 4.2))
for name, errs in step_errors.items():
    label = name + (f" (slope {slopes[name]:.2f})" if name in slopes else " (exact for a held input)")
    ax.loglog(deltas, np.maximum(errs, 1e-17), marker="o", label=label)
ax.set_xlabel("step size delta")
ax.set_ylabel("relative error of x(t_end), t_end = 5")
ax.set_title("Step response: global error against the step size")
ax.legend()
plt.show()

# %% tags=["nbval-check-output"]
for n_steps, x in zip(steps[[0, 5]], np.array(final_state["ZOH"])[[0, 5]]):   # 20 and 640 steps
    check(f"ZOH, {n_steps} steps, vs the exact step response", x, exact_end, REFERENCE_BUDGET)
print("Euler is first order, bilinear second order:", abs(slopes["Euler"] - 1) < 0.1 and abs(slopes["bilinear"] - 2) < 0.1)

# %% [markdown]
# ## 5. The recurrence is a convolution
#
# From a zero state, unroll $x_k = \bar A x_{k-1} + \bar B u_k$:
# $x_k = \sum_{j=0}^{k} \bar A^{j}\bar B\,u_{k-j}$, hence $y_k = C x_k = \sum_{j=0}^{k} \left(C\bar A^{j}\bar B\right)
# u_{k-j}$. That is a causal convolution with a kernel fixed once and for all (the notes' formula, their $M$ being the
# length):
#
# $$\bar K = \left(C\bar B,\; C\bar A\bar B,\; C\bar A^2\bar B,\; \dots,\; C\bar A^{M-1}\bar B\right), \qquad y = \bar K * u .$$
#
# The recurrence needs $T$ sequential steps; the convolution can be done for all positions at once (below with the
# FFT, $O(T \log T)$), which is how S4 trains. Both need $\bar A, \bar B, C$ to be the same at every step: a linear
# *time-invariant* system. $\bar K_j$ is the continuous impulse response $C e^{tA} B$ integrated over step $j$:
# $\bar K_j = C e^{j\Delta A}\int_0^\Delta e^{As}ds\,B = \int_{j\Delta}^{(j+1)\Delta} C e^{At} B\,dt \approx
# \Delta\, C e^{(j + 1/2)\Delta A} B$.

# %%
T_seq = 64
u_seq = rng.standard_normal(T_seq)
K_bar = np.array([C @ np.linalg.matrix_power(A_bar, j) @ B_bar for j in range(T_seq)])   # (T,) by the formula
y_rec, _ = ref.ssm_recurrence(A_bar, B_bar, C, u_seq)                                       # (T,)
n_fft = 2 * T_seq                                                # zero-padded: no wrap-around
y_fft = np.fft.irfft(np.fft.rfft(K_bar, n_fft) * np.fft.rfft(u_seq, n_fft), n_fft)[:T_seq]
K_integrated = np.array([sum(wt * delta / 2 * C @ ref.expm((j * delta + si) * A) @ B for si, wt in zip(s, weights))
                         for j in range(T_seq)])          # int over step j of C e^{tA} B dt (the quadrature of section 2)

# %% tags=["nbval-check-output"]
for what, actual, expected in (
    ("kernel by the formula vs reference.ssm_kernel", K_bar, ref.ssm_kernel(A_bar, B_bar, C, T_seq)),
    ("kernel vs the impulse response integrated over each step", K_bar, K_integrated),
    ("recurrence vs reference.causal_convolution(K, u)", y_rec, ref.causal_convolution(K_bar, u_seq)),
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
mismatch = rel_rms(ref.causal_convolution(K_bar, u_seq), y_from_derivative)
print(f"notes' kernel vs y = C x': rel. error {mismatch:.2f};  vs y = C x: {rel_rms(ref.causal_convolution(K_bar, u_seq), y_rec):.1e}")
assert mismatch > 0.1

t_fine = np.linspace(0, (T_seq - 1) * delta, 400)
impulse = np.array([C @ ref.expm(t * A) @ B for t in t_fine])
fig, ax = plt.subplots(figsize=(7, 3.8))
ax.plot(t_fine, delta * impulse, label="delta * C e^{tA} B (continuous impulse response)")
ax.plot((np.arange(T_seq) + 0.5) * delta, K_bar, "o", markersize=3,
        label="K_bar_j = C A_bar^j B_bar (ZOH, delta = 0.5), at t = (j + 1/2) delta")
ax.set_xlabel("time t")
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
# $$x_t = e^{\Delta_t A}\odot x_{t-1} + \Delta_t B_t\, u_t, \qquad y_t = C_t \cdot x_t + D\,u_t, \qquad
# \text{then } y_t \odot \mathrm{silu}(z_t),$$
#
# with $\Delta = \mathrm{softplus}(\Delta_\text{raw} + \text{bias})$ when asked for. Since $\bar A_t, \bar B_t, C_t$
# change with $t$, there is no fixed kernel $\bar K$: the recurrence must be run as a scan (hence the name).
#
# **What the notes write (erratum 12).** Their Algorithm 1 returns $\bar A = \Delta \otimes A$ and
# $\bar B = \Delta \otimes B$, right after deriving ZOH. The first lacks the exponential: $\bar A = e^{\Delta A}$,
# as in section 2 (with $A < 0$, $e^{\Delta A} \in (0, 1)$ is a decay, while $\Delta A < 0$ would flip the state's
# sign at every step and, once $\Delta |A| > 1$, blow it up). The second is not ZOH's $\bar B$: it is Euler's,
# $\bar B = \Delta B$, which Mamba uses on purpose (a simplification: it agrees with ZOH's to first order in $\Delta A$).
# For diagonal $A$, ZOH's is
#
# $$\bar B^{\text{ZOH}} = \frac{e^{\Delta A} - 1}{A}\, B, \qquad
# \frac{\bar B^{\text{Euler}}}{\bar B^{\text{ZOH}}} = \frac{\Delta A}{e^{\Delta A} - 1} = 1 - \frac{\Delta A}{2} +
# O(\Delta^2 A^2),$$
#
# close to 1 for small steps, about $\Delta |A|$ for large ones. The reference computes Mamba's scan
# (`zoh_b=False`, the default) and the exact-ZOH variant (`zoh_b=True`).

# %%
batch, D_ch, N_st, T_seq = 2, 3, 4, 16
u_s = rng.standard_normal((batch, D_ch, T_seq))                     # (batch, D, T)
delta_s = np.log1p(np.exp(rng.standard_normal((batch, D_ch, T_seq)) - 1))   # softplus: positive steps
A_s = -np.exp(rng.standard_normal((D_ch, N_st)))                    # (D, N) negative: decaying modes
B_s, C_s = rng.standard_normal((batch, N_st, T_seq)), rng.standard_normal((batch, N_st, T_seq))   # (batch, N, T)

def selective_scan(u, delta, A, B, C, zoh_b=False):
    # x_t = exp(delta_t A) x_{t-1} + B_bar_t u_t, y_t = C_t . x_t (no D, z: they are elementwise).
    x = np.zeros((u.shape[0], u.shape[1], A.shape[1]))             # (batch, D, N)
    y = np.empty(u.shape)
    for t in range(u.shape[2]):
        step = delta[:, :, t, None]                                 # (batch, D, 1)
        A_bar_t = np.exp(step * A)                                  # (batch, D, N)
        B_bar_t = ((A_bar_t - 1) / A if zoh_b else step) * B[:, None, :, t]   # ZOH or Mamba's (Euler)
        x = A_bar_t * x + B_bar_t * u[:, :, t, None]
        y[:, :, t] = (x * C[:, None, :, t]).sum(axis=-1)
    return y

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
u_1 = u_s[:1]                                                          # one batch element, (1, D, T)
tile = lambda vec: np.repeat(vec[None, :, None], T_seq, axis=2)        # (1, N, T), the same at every token
scan_zoh = ref.selective_scan(u_1, np.full(u_1.shape, d_const), A_s, tile(B_const), tile(C_const), zoh_b=True)[0]
scan_mamba = ref.selective_scan(u_1, np.full(u_1.shape, d_const), A_s, tile(B_const), tile(C_const))[0]
lti_zoh, lti_mamba = np.empty_like(scan_zoh), np.empty_like(scan_mamba)
for ch in range(D_ch):
    a_bar, b_bar = ref.discretize_zoh_diagonal(A_s[ch], B_const, d_const)                 # (N,), (N,)
    lti_zoh[0, ch] = ref.ssm_recurrence(np.diag(a_bar), b_bar, C_const, u_1[0, ch])[0]
    lti_mamba[0, ch] = ref.ssm_recurrence(np.diag(a_bar), d_const * B_const, C_const, u_1[0, ch])[0]

# %% tags=["nbval-check-output"]
check("constant delta, B, C: ZOH scan vs LTI recurrence (ZOH)", scan_zoh, lti_zoh, REFERENCE_BUDGET)
check("constant delta, B, C: Mamba scan vs LTI recurrence (exp(delta A), delta B)", scan_mamba, lti_mamba,
      REFERENCE_BUDGET)
print("Mamba's and ZOH's outputs differ here: rel. difference > 1%:", rel_rms(scan_mamba, scan_zoh) > 0.01)


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

print(f"largest |state| after {T_seq} tokens, delta x 4: A_bar = exp(delta A): "
      f"{np.abs(ref.selective_scan(u_s, 4 * delta_s, A_s, B_s, C_s)[1]).max():.2f};  "
      f"A_bar = delta A as printed: {scan_with_A_bar_as_printed(u_s, 4 * delta_s, A_s, B_s, C_s):.2e}")

x_axis = np.geomspace(1e-3, 20, 200)                       # delta |A|
factors = np.geomspace(0.01, 30, 25)
output_diff = [rel_rms(ref.selective_scan(u_s, f * delta_s, A_s, B_s, C_s)[0],
                       ref.selective_scan(u_s, f * delta_s, A_s, B_s, C_s, zoh_b=True)[0]) for f in factors]
fig, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
axes[0].loglog(x_axis, x_axis / -np.expm1(-x_axis), label="delta A / (e^{delta A} - 1)")
axes[0].loglog(x_axis, 1 + x_axis / 2, "--", label="1 + delta |A| / 2 (first order)")
axes[0].set_xlabel("delta |A|")
axes[0].set_ylabel("B_bar (Euler, Mamba) / B_bar (ZOH)")
axes[0].set_title("Mamba's B_bar against the ZOH one")
axes[0].legend()
typical_step = np.median(delta_s[..., None] * np.abs(A_s)[None, :, None, :])   # median delta |A| over (b, d, t, n)
axes[1].loglog(factors * typical_step, output_diff, marker="o")
axes[1].set_xlabel("median delta |A| over the sequence")
axes[1].set_ylabel("rel. difference of the outputs")
axes[1].set_title("Selective scan: Mamba's B_bar vs exact ZOH")
plt.show()

# %% [markdown]
# ## 7. The torch path and the Triton kernel against the reference
#
# [`kernels.ssm.selective_scan`](../kernels/ssm.py) is Mamba's scan (Euler $\bar B$) with all its options: the skip
# $D$, the gate $z$, the bias and softplus of $\Delta$, an initial state, and the last state returned. Backend
# `"torch"` runs a chunked scan; backend `"triton"` walks time in a kernel with the state in registers (here under
# the Triton interpreter on the CPU, so the shapes are small). Both are checked against `reference.ssm.selective_scan`
# on the same inputs: outputs and last states, a sequence fed in two pieces, and fp16.
#
# A third implementation, backend `"c"` ([`kernels/native.c`](../kernels/native.c)), is a compiled C loop that
# walks time once: the path for inference on a CPU. It is forward only (no gradients), and `backend=None` takes it
# on a CPU when no gradient is wanted. The forward checks below run it too, against the same reference and budgets.

# %%
batch, D_ch, N_st, T = 2, 4, 8, 24
u64, delta64, z64 = (rng.standard_normal((batch, D_ch, T)) for _ in range(3))   # (batch, D, T)
A64 = -np.exp(rng.standard_normal((D_ch, N_st)))                               # (D, N)
B64, C64 = rng.standard_normal((batch, N_st, T)), rng.standard_normal((batch, N_st, T))
D64, bias64 = rng.standard_normal(D_ch), rng.standard_normal(D_ch)             # (D,)
inputs = dict(u=u64, delta=delta64, A=A64, B=B64, C=C64, D=D64, z=z64, delta_bias=bias64)
BACKENDS = ("torch", "triton")
FORWARD_BACKENDS = BACKENDS + ("c",)                                           # "c": the C loop, forward only

def run(backend, dtype=torch.float32, state=None, **arrays):
    # The kernel on float64 arrays cast to dtype (A, D, delta_bias stay fp32, as Mamba keeps them).
    fp32_params = ("A", "D", "delta_bias")
    t = {n: torch.tensor(x, dtype=torch.float32 if n in fp32_params else dtype) for n, x in arrays.items()}
    return scan_kernel(**t, delta_softplus=True, state=state, backend=backend)

def fp16_rounded(x):
    return x.astype(np.float16).astype(np.float64)

expected, expected_last = ref.selective_scan(**inputs, delta_softplus=True)
split = 10
first = {n: (x[..., :split] if x.ndim == 3 else x) for n, x in inputs.items()}
rest = {n: (x[..., split:] if x.ndim == 3 else x) for n, x in inputs.items()}

# %% tags=["nbval-check-output"]
for backend in FORWARD_BACKENDS:
    y, last = run(backend, **inputs)
    check(f"{backend} fp32 y", y, expected, FP32_BUDGET)
    check(f"{backend} fp32 last state", last, expected_last, FP32_BUDGET)
    y1, state1 = run(backend, **first)
    y2, _ = run(backend, state=state1, **rest)
    check(f"{backend} fp32 fed in two pieces", torch.cat([y1, y2], dim=-1), expected, FP32_BUDGET)
    rounded = {n: (x if n in ("A", "D", "delta_bias") else fp16_rounded(x)) for n, x in inputs.items()}
    check(f"{backend} fp16 y", run(backend, dtype=torch.float16, **rounded)[0],
          ref.selective_scan(**rounded, delta_softplus=True)[0], FP16_BUDGET)


# %% [markdown]
# **Gradients.** The float64 truth for the gradients is autograd through a plain token-by-token torch loop of the
# same scan (its forward is first checked against the reference). Both backends' fp32 gradients of
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

G = rng.standard_normal((batch, D_ch, T))                                     # upstream gradient dLoss/dy
names = list(inputs)

def gradients(fn, dtype):
    leaves = {n: torch.tensor(x, dtype=dtype, requires_grad=True) for n, x in inputs.items()}
    fn(**leaves).backward(torch.tensor(G, dtype=dtype))
    return [leaves[n].grad for n in names]

expected_grads = gradients(scan_loop_torch, torch.float64)
backend_grads = {b: gradients(lambda **t: scan_kernel(**t, delta_softplus=True, backend=b)[0], torch.float32)
                 for b in BACKENDS}

# %% tags=["nbval-check-output"]
check("token loop in torch float64 vs reference", scan_loop_torch(**{n: torch.tensor(x) for n, x in inputs.items()}),
      expected, REFERENCE_BUDGET)
for backend in BACKENDS:
    for name, got, want in zip(names, backend_grads[backend], expected_grads):
        check(f"{backend} fp32 d{name}", got, want, FP32_BUDGET)

# %%
# The errors themselves (this cell is not compared: the numbers depend on the machine).
for backend in FORWARD_BACKENDS:
    line = f"{backend:6s} fp32: y rel. RMS error {rel_rms(run(backend, **inputs)[0], expected):.1e}"
    if backend in backend_grads:                                           # none for "c": forward only
        line += f", worst gradient {max(rel_rms(g, e) for g, e in zip(backend_grads[backend], expected_grads)):.1e}"
    print(line)

# %% [markdown]
# ## Summary
#
# - ZOH solves the system exactly for a held input: $\bar A = e^{\Delta A}$, $\bar B = \int_0^\Delta e^{As}ds\,B$,
#   which the augmented-matrix exponential computes even for a singular $A$; it matches the closed form and a direct
#   quadrature to float64 rounding.
# - Of the three ways to compute $e^{A}$, only scaling and squaring is safe in general: the series fails for large
#   $\|A\|$, the eigendecomposition for defective $A$.
# - Euler is first order, bilinear second order, ZOH exact for a held input (the log-log slopes 1 and 2).
# - A time-invariant SSM is a convolution with $\bar K = (C\bar B, C\bar A\bar B, \dots)$; Mamba's input-dependent
#   $\Delta, B, C$ make it a scan, with $\bar A = e^{\Delta A}$ and Euler's $\bar B = \Delta B$.
# - The torch path and the Triton kernel match the reference in fp32 and fp16: outputs, states, pieces and
#   gradients.
