"""Kennedy and Carpenter's additive Runge-Kutta (IMEX) methods.

C. A. Kennedy and M. H. Carpenter, "Additive Runge-Kutta schemes for
convection-diffusion-reaction equations", Appl. Numer. Math. 44 (2003) 139-181:
ARK3(2)4L[2]SA, ARK4(3)6L[2]SA and ARK5(4)8L[2]SA. Each pairs an explicit tableau for
the non-stiff part with an ESDIRK tableau for the stiff part (L-stable and stiffly
accurate), sharing the stage times and the weights b. The dense output is the paper's
continuous extension (of order 2, 3 and 3), applied to the sum of both parts' stages.
Coefficients are the paper's rationals.

Error estimate. The paper's embedded methods of one order lower are nearly as accurate
as the methods themselves and not L-stable, so their difference from the solution bounds
neither: steps were accepted with errors above the estimate, and long ones left the
third-order dense output far from the solution. At rtol 1e-8 KenCarp5 ended 260 times
the tolerance from the solution of Robertson's problem and 3200 times on Lotka-Volterra
(solved implicitly), KenCarp4 11 and 15 times. KenCarp4 and KenCarp5 therefore measure
their error against the L-stable method of order 2 and 3 on their own stages, of that
order in the explicit, the implicit and every coupling term (see `_additive_embedding`),
with the controller's exponent of that method, as Radau IIA codes and `Kvaerno4` and
`Kvaerno5` do. KenCarp3 keeps the paper's second-order embedding: the only L-stable one
on its four stages is of order 1 and takes 10 to 30 times the steps.
"""

import numpy as np

from ._additive import AbstractAdditiveRungeKutta
from ._additive_embedding import additive_l_stable_embedding
from ._additive_tableau import AdditiveTableau
from ._tableau import as_floats


def _full(rows, s: int, diagonal: float) -> tuple:
    """(s, s) matrix: `rows` below the first, each padded, `diagonal` on the diagonal of
    every row after the first."""
    full = [[0.0] * s]
    for i, row in enumerate(rows, start=1):
        full.append(list(row) + [0.0] * (s - len(row)))
        full[i][i] = diagonal
    return tuple(map(tuple, full))


def _kennedy_carpenter(
    gamma, c, explicit, implicit, b, interp, order, b_embedded=None, embedding_order=None
):
    """The additive tableau from the paper's data: `c` (s - 1 stage times after the
    first), the explicit rows (strictly lower) and the implicit rows below the diagonal
    of stages 2..s-1 (the last implicit row is b, stiffly accurate), b and the
    dense-output coefficients (lowest power of theta first). The error estimate is
    against the paper's embedded weights `b_embedded`, or against the L-stable method
    of `embedding_order` on the same stages (the controller's exponent is then
    1 / (embedding_order + 1))."""
    gamma, c, b = as_floats(gamma), (0.0, *as_floats(c)), as_floats(b)
    s = len(b)
    implicit = as_floats(implicit) + (b[:-1],)
    a_explicit, a_implicit = _full(as_floats(explicit), s, 0.0), _full(implicit, s, gamma)
    error_order = None
    if embedding_order is None:
        embedded = as_floats(b_embedded)
    else:
        matrices = np.array(a_explicit), np.array(a_implicit)
        embedded = additive_l_stable_embedding(*matrices, embedding_order)
        error_order = embedding_order + 1
    error = tuple(float(x - y) for x, y in zip(b, embedded))
    interp = as_floats(interp)
    return AdditiveTableau(
        c_explicit=c,
        c_implicit=c,
        a_explicit=a_explicit,
        a_implicit=a_implicit,
        b_explicit=b,
        b_implicit=b,
        error_explicit=error,
        error_implicit=error,
        interp_explicit=interp,
        interp_implicit=interp,
        order=order,
        error_order=error_order,
    )


_G3 = "1767732205903/4055673282236"
_KENCARP3 = _kennedy_carpenter(
    gamma=_G3,
    c=(2 * float(as_floats(_G3)), "3/5", 1),
    explicit=(
        (2 * float(as_floats(_G3)),),
        ("5535828885825/10492691773637", "788022342437/10882634858940"),
        ("6485989280629/16251701735622", "-4246266847089/9704473918619", "10755448449292/10357097424841"),
    ),
    implicit=(
        (_G3,),
        ("2746238789719/10658868560708", "-640167445237/6845629431997"),
    ),
    b=("1471266399579/7840856788654", "-4482444167858/7529755066697", "11266239266428/11593286722821", _G3),
    b_embedded=("2756255671327/12835298489170", "-10771552573575/22201958757719", "9247589265047/10645013368117", "2193209047091/5459859503100"),
    interp=(
        ("4655552711362/22874653954995", "-215264564351/13552729205753"),
        ("-18682724506714/9892148508045", "17870216137069/13817060693119"),
        ("34259539580243/13192909600954", "-28141676662227/17317692491321"),
        ("584795268549/6622622206610", "2508943948391/7218656332882"),
    ),
    order=3,
)  # fmt: skip

_KENCARP4 = _kennedy_carpenter(
    gamma="1/4",
    c=("1/2", "83/250", "31/50", "17/20", 1),
    explicit=(
        ("1/2",),
        ("13861/62500", "6889/62500"),
        ("-116923316275/2393684061468", "-2731218467317/15368042101831", "9408046702089/11113171139209"),
        ("-451086348788/2902428689909", "-2682348792572/7519795681897", "12662868775082/11960479115383", "3355817975965/11060851509271"),
        ("647845179188/3216320057751", "73281519250/8382639484533", "552539513391/3454668386233", "3354512671639/8306763924573", "4040/17871"),
    ),
    implicit=(
        ("1/4",),
        ("8611/62500", "-1743/31250"),
        ("5012029/34652500", "-654441/2922500", "174375/388108"),
        ("15267082809/155376265600", "-71443401/120774400", "730878875/902184768", "2285395/8070912"),
    ),
    b=("82889/524892", 0, "15625/83664", "69875/102672", "-2260/8211", "1/4"),
    interp=(
        ("6943876665148/7220017795957", "-54480133/30881146", "6818779379841/7100303317025"),
        (0, 0, 0),
        ("7640104374378/9702883013639", "-11436875/14766696", "2173542590792/12501825683035"),
        ("-20649996744609/7521556579894", "174696575/18121608", "-31592104683404/5083833661969"),
        ("8854892464581/2390941311638", "-12120380/966161", "61146701046299/7138195549469"),
        ("-11397109935349/6675773540249", "3843/706", "-17219254887155/4939391667607"),
    ),
    order=4,
    embedding_order=2,
)  # fmt: skip

_KENCARP5 = _kennedy_carpenter(
    gamma="41/200",
    c=("41/100", "2935347310677/11292855782101", "1426016391358/7196633302097", "92/100", "24/100", "3/5", 1),
    explicit=(
        ("41/100",),
        ("367902744464/2072280473677", "677623207551/8224143866563"),
        ("1268023523408/10340822734521", 0, "1029933939417/13636558850479"),
        ("14463281900351/6315353703477", 0, "66114435211212/5879490589093", "-54053170152839/4284798021562"),
        ("14090043504691/34967701212078", 0, "15191511035443/11219624916014", "-18461159152457/12425892160975", "-281667163811/9011619295870"),
        ("19230459214898/13134317526959", 0, "21275331358303/2942455364971", "-38145345988419/4862620318723", "-1/8", "-1/8"),
        ("-19977161125411/11928030595625", 0, "-40795976796054/6384907823539", "177454434618887/12078138498510", "782672205425/8267701900261", "-69563011059811/9646580694205", "7356628210526/4942186776405"),
    ),
    implicit=(
        ("41/200",),
        ("41/400", "-567603406766/11931857230679"),
        ("683785636431/9252920307686", 0, "-110385047103/1367015193373"),
        ("3016520224154/10081342136671", 0, "30586259806659/12414158314087", "-22760509404356/11113319521817"),
        ("218866479029/1489978393911", 0, "638256894668/5436446318841", "-1179710474555/5321154724896", "-60928119172/8023461067671"),
        ("1020004230633/5715676835656", 0, "25762820946817/25263940353407", "-2161375909145/9755907335909", "-211217309593/5846859502534", "-4269925059573/7827059040719"),
    ),
    b=("-872700587467/9133579230613", 0, 0, "22348218063261/9555858737531", "-1143369518992/8141816002931", "-39379526789629/19018526304540", "32727382324388/42900044865799", "41/200"),
    interp=(
        ("-17674230611817/10670229744614", "43486358583215/12773830924787", "-9257016797708/5021505065439"),
        (0, 0, 0),
        (0, 0, 0),
        ("65168852399939/7868540260826", "-91478233927265/11067650958493", "26096422576131/11239449250142"),
        ("15494834004392/5936557850923", "-79368583304911/10890268929626", "92396832856987/20362823103730"),
        ("-99329723586156/26959484932159", "-12239297817655/9152339842473", "30029262896817/10175596800299"),
        ("-19024464361622/5461577185407", "115839755401235/10719374521269", "-26136350496073/3983972220547"),
        ("-6511271360970/6095937251113", "5843115559534/2180450260947", "-5289405421727/3760307252460"),
    ),
    order=5,
    embedding_order=3,
)  # fmt: skip


class KenCarp3(AbstractAdditiveRungeKutta):
    """Kennedy and Carpenter's 3(2) IMEX method, ARK3(2)4L[2]SA: 4 stages, the implicit
    part L-stable and stiffly accurate; dense output of order 2. Takes
    `MultiTerm(ODETerm(non_stiff), ODETerm(stiff))`."""

    tableau = _KENCARP3


class KenCarp4(AbstractAdditiveRungeKutta):
    """Kennedy and Carpenter's 4(3) IMEX method, ARK4(3)6L[2]SA: 6 stages, the implicit
    part L-stable and stiffly accurate; dense output of order 3. Takes
    `MultiTerm(ODETerm(non_stiff), ODETerm(stiff))`. The first choice for a field with a
    stiff and a non-stiff part."""

    tableau = _KENCARP4


class KenCarp5(AbstractAdditiveRungeKutta):
    """Kennedy and Carpenter's 5(4) IMEX method, ARK5(4)8L[2]SA: 8 stages, the implicit
    part L-stable and stiffly accurate; dense output of order 3. Takes
    `MultiTerm(ODETerm(non_stiff), ODETerm(stiff))`."""

    tableau = _KENCARP5
